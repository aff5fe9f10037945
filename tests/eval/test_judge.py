"""The Final Evaluation Judge on T1: a panel of (fake) LLM judges replaces the rule labels by
its majority, every vote is kept in the item's record, a panel that cannot label an item stops
the run or falls back to the rules as configured, runs scored by different judges are not
compared, and the calibration against human labels covers the rules, the panel and each judge.
"""

import json

import httpx
import pytest

from hat_jax import llm_client
from hat_jax.eval import (
    KINDS,
    EvalContext,
    FactoryPolicy,
    SetVersionError,
    compare_runs,
    ensure_sets,
    evaluate,
    read_items,
)
from hat_jax.eval import _calibration as cal
from rl import sim
from rl.rewards import JudgeEndpoint, JudgePanel, JudgeUnavailable

# model -> its answer: two judges say accuracy 1 / effectiveness 0.5, one says 0 / 1.
ANSWERS = {
    "a": {"accuracy": 1, "effectiveness": 0.5, "reason": "half answered"},
    "b": {"accuracy": 1, "effectiveness": 0.5, "reason": "half"},
    "c": {"accuracy": 0, "effectiveness": 1, "reason": "wrong figure"},
}


def _panel(down=()):
    def handle(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        if model in down:
            return httpx.Response(500, json={"error": "down"})
        content = json.dumps(ANSWERS[model])
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    judges = [JudgeEndpoint(base_url="http://judge.test/v1", model=m) for m in ANSWERS]
    return JudgePanel(judges, transport=httpx.MockTransport(handle),
                      retry=llm_client.RetryPolicy(attempts=1))  # fmt: skip


def _teacher():
    return FactoryPolicy(
        lambda p, ctx: sim.ScriptedTeacher(p.scenario, p.state, ctx.world),
        describe={"kind": "teacher"},
        agent_only=True,
    )


@pytest.fixture(scope="module")
def t1(tmp_path_factory):
    ctx = EvalContext.default()
    (s,) = ensure_sets(["t1"], ctx, sets_dir=tmp_path_factory.mktemp("sets"), sizes={"t1": 3})
    return ctx, s


def _run(ctx, s, run_dir, **judge):
    import dataclasses

    ctx = dataclasses.replace(ctx, **judge)
    return evaluate([s], _teacher(), kinds=KINDS, ctx=ctx, run_dir=run_dir, progress=False)


def test_the_panel_labels_replace_the_rules_and_votes_are_kept(t1, tmp_path):
    ctx, s = t1
    summary = _run(ctx, s, tmp_path / "panel", judge=_panel())
    got = summary["sets"]["t1"]["metrics"]
    assert (got["accuracy"], got["effectiveness"], got["avg"]) == (1.0, 0.5, 0.75)
    assert got["tool_rationality"] == 1.0  # still the rule reward
    assert summary["run"]["judge"]["kind"] == "panel"
    record = read_items(tmp_path / "panel", "t1")[0]
    assert record["details"]["rules"] == {"accuracy": 1.0, "effectiveness": 1.0}
    votes = record["details"]["judge"]["votes"]
    assert [v["judge"] for v in votes] == ["a", "b", "c"] and votes[2]["accuracy"] == 0.0
    # A rule-scored run and a panel-scored run are not compared, nor mixed in one directory.
    _run(ctx, s, tmp_path / "rules")
    with pytest.raises(SetVersionError, match="same Final Evaluation Judge"):
        compare_runs(tmp_path / "rules", tmp_path / "panel")
    with pytest.raises(SetVersionError, match="judge"):
        _run(ctx, s, tmp_path / "panel")


def test_a_panel_that_cannot_label_fails_or_falls_back(t1, tmp_path):
    ctx, s = t1
    with pytest.raises(JudgeUnavailable, match=s[0].id):
        _run(ctx, s, tmp_path / "fail", judge=_panel(down=("a", "b", "c")))
    summary = _run(ctx, s, tmp_path / "rules", judge=_panel(down=("a", "b", "c")),
                   judge_on_failure="rules")  # fmt: skip
    assert summary["sets"]["t1"]["metrics"]["avg"] == 1.0  # the teacher under the rules
    record = read_items(tmp_path / "rules", "t1")[0]
    assert record["details"]["judge"]["fallback"] == "rules"
    with pytest.raises(ValueError, match="judge_on_failure"):
        EvalContext(world=ctx.world, harness=ctx.harness, judge_on_failure="ignore")


def test_calibration_of_rules_panel_and_each_judge(t1, tmp_path):
    ctx, s = t1
    _run(ctx, s, tmp_path / "run", judge=_panel())
    ids = [item.id for item in s]
    labels = tmp_path / "labels.csv"
    rows = ["item_id,dimension,label"]
    rows += [f"{i},accuracy,1" for i in ids]
    rows += [f"{ids[0]},effectiveness,0.5", f"{ids[1]},effectiveness,0.5",
             f"{ids[2]},effectiveness,1"]  # fmt: skip
    labels.write_text("\n".join(rows) + "\n")
    report = cal.calibration_report(
        cal.read_labels(labels), cal.run_predictions(tmp_path / "run", "t1")
    )
    acc, eff = report["accuracy"], report["effectiveness"]
    assert set(acc) == {"panel", "a", "b", "c", "rules"}
    assert acc["panel"]["agreement"] == 1.0 and acc["c"]["agreement"] == 0.0
    assert eff["panel"]["agreement"] == pytest.approx(2 / 3)  # panel says 0.5 on all three
    assert eff["rules"]["agreement"] == pytest.approx(1 / 3)  # the rules say 1 on all three
    assert eff["c"]["agreement"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="carry no Accuracy/Effectiveness labels"):
        cal.run_predictions(tmp_path / "run", "t3_tool")
