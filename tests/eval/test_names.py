"""Names written under renames (`hat_jax.eval._names`): counted by hand on a trajectory, carried
into an evaluation record and the set's summary, and shown in the report."""

import json

from hat_jax import harness as hx
from hat_jax.eval import _run
from hat_jax.eval._items import EvalItem
from hat_jax.eval._names import copy_share, name_counts, names_table, total_counts
from hat_jax.eval._report import write_report
from hat_jax.harness._trajectory import ToolRecord


def _call(name, canonical, arguments=None):
    return ToolRecord(round=0, call_id=name, name=name, canonical=canonical,
                         arguments=arguments or {})  # fmt: skip


def _trajectory():
    """A state renaming `get_product` -> `fetch_item` and the Skill `price-rules` ->
    `cost-guide`; the policy calls the listed `fetch_item` once, the memorised `get_product`
    once, the unrenamed `reply_comment`, an invented `tool_9f2a`; loads Skills by the listed
    name, by the training name and by an unrenamed name that loaded."""
    return hx.Trajectory(
        request={},
        harness={},
        renames={
            "tools": {"fetch_item": "get_product"},
            "skills": {"cost-guide": "price-rules"},
        },  # fmt: skip
        limits={},
        tool_calls=[
            _call("fetch_item", "get_product"),
            _call("get_product", None),
            _call("reply_comment", "reply_comment"),
            _call("tool_9f2a", None),
            _call("load_skill", "load_skill", {"name": "cost-guide"}),
            _call("load_skill", "load_skill", {"name": "price-rules"}),
            _call("load_skill", "load_skill", {"name": "greeting"}),
            _call("load_skill", "load_skill", {"name": "no-such-skill"}),
        ],
        loaded_skills=["cost-guide", "greeting"],
    )


def test_each_call_is_counted_by_the_name_it_wrote():
    counts = name_counts(_trajectory().to_dict())
    assert counts == {
        "tool/listed": 1, "tool/training": 1, "tool/unrenamed": 5, "tool/unknown": 1,
        "skill/listed": 1, "skill/training": 1, "skill/unrenamed": 1, "skill/unknown": 1,
    }  # fmt: skip
    assert copy_share(counts, "tool") == 0.5 and copy_share(counts, "skill") == 0.5
    # No renames: every resolved call is unrenamed, and no copy share exists.
    plain = name_counts({"renames": {}, "tool_calls": [{"name": "a", "canonical": "a"}]})
    assert plain["tool/unrenamed"] == 1 and copy_share(plain, "tool") is None
    assert total_counts([{"names": counts}, {"names": plain}, {}])["tool/unrenamed"] == 6


def test_the_record_and_summary_carry_the_counts_whether_or_not_trajectories_are_kept():
    item = EvalItem(id="t2-1", set="t2", family="price", scenario={"id": "s"})
    for keep in (True, False):
        rec = _run._record(item, {"avg": 1.0}, _trajectory(), 0.1, keep)
        assert rec["names"]["tool/training"] == 1 and (rec["trajectory"] is None) != keep
    summary = _run.summarize([rec, rec], ["avg"])
    assert summary["names"]["tool/listed"] == 2 and summary["names"]["skill/unknown"] == 2
    assert "names" not in _run.summarize([{**rec, "names": {}}], ["avg"])


def test_the_report_shows_the_names_table(tmp_path):
    counts = name_counts(_trajectory().to_dict())
    summary = {"run": {"policy": {"kind": "jax"}},
               "sets": {"t2": {"version": "t2-x", "n": 1, "metrics": {"avg": 1.0},
                               "families": {}, "names": counts}}}  # fmt: skip
    (tmp_path / "items").mkdir()
    (tmp_path / "items" / "t2.jsonl").write_text(
        json.dumps({"id": "t2-1", "set": "t2", "family": "price", "scores": {"avg": 1.0}}) + "\n"
    )
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    text = write_report(tmp_path, resamples=50).read_text()
    assert "| tool calls | 1 | 1 | 5 | 1 | 50.0 |" in text
    assert "| Skill loads | 1 | 1 | 1 | 1 | 50.0 |" in text
    assert names_table({}) == []
