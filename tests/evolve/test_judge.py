"""The judge as an evolution case (appendix D), offline: a judge prompt that lost a rubric
sentence disagrees with human labels on honest follow-ups; the proposer restores the sentence
and agreement per dimension recovers."""

import json
import shutil
import types

import httpx
import pytest

from hat_jax import eval as hev
from hat_jax import evolve, livestream
from hat_jax import harness as hx
from launch.eval import policy_for
from rl.rewards import JudgeEndpoint

PROMPTS = "rl/rewards/prompts"
FOLLOW_UP = (
    " If a tool failed and the reply honestly says the host will follow up instead of\n"
    "guessing, that question counts as answered."
)
JUDGES = [JudgeEndpoint(base_url="http://scripted/v1", model="scripted")]


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory):
    """A teacher run under a Harness whose refused price tool makes the host follow up, and
    human labels counting those follow-ups as answers."""
    tmp = tmp_path_factory.mktemp("judge")
    source = tmp / "harness"
    shutil.copytree(hx.load(livestream.default_world_dir()).source, source)
    (source / "manifest.json").unlink()
    skill = source / "skills" / "product-qa" / "SKILL.md"
    skill.write_text(skill.read_text().replace(" get_price_promotion\n", "\n"))
    e = tmp / "evolve"
    version = evolve.init(e, source)
    split = evolve.DevSplit(sets=("t1",), size=30, sets_dir=str(tmp / "sets"))
    run = evolve.run_dev(e, version, policy_for(types.SimpleNamespace(kind="teacher")), split)
    rows = []
    for r in hev.read_items(run, "t1-dev"):
        rows.append({"item_id": r["id"], "dimension": "accuracy", "label": 1})
        rows.append({"item_id": r["id"], "dimension": "effectiveness", "label": 1})
    labels = tmp / "labels.jsonl"
    labels.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run, labels


def test_the_judge_prompt_evolves_against_human_labels(tmp_path, labelled_run):
    run, labels = labelled_run
    transport = httpx.MockTransport(evolve.ScriptedJudge())
    args = (run, "t1-dev", labels, JUDGES, transport)
    j = tmp_path / "judge"
    original = evolve.init(j, PROMPTS, kind="judge")
    damaged = tmp_path / "damaged"
    shutil.copytree(PROMPTS, damaged)
    system = (damaged / "judge_system.md").read_text()
    assert FOLLOW_UP in system
    (damaged / "judge_system.md").write_text(system.replace(FOLLOW_UP, ""))
    edit = evolve.store(j, damaged)
    worse = evolve.judge_evaluate(j, edit, *args)
    assert worse["agreement"]["before"]["effectiveness"] == 1.0
    assert worse["agreement"]["after"]["effectiveness"] < 1.0
    assert worse["regressions"] == ["effectiveness"]
    evolve.decide(j, "promote", version=edit, evidence=worse["dir"], note="shorter rubric")

    report = evolve.judge_diagnose(j, run, "t1-dev", labels, tmp_path / "diag", JUDGES, transport)
    assert json.loads((tmp_path / "diag" / "failures.json").read_text())["clusters"]
    top = report["clusters"][0]
    assert top["category"] == "effectiveness"
    assert top["cause"].startswith("judge 0 where humans say 1")

    proposal = evolve.propose(j, tmp_path / "diag", evolve.JudgeRuleProposer())
    assert "+guessing, that question counts as answered." in proposal["diff"]
    assert proposal["version"] == original
    better = evolve.judge_evaluate(j, proposal["version"], *args)
    assert better["agreement"]["after"] == {"accuracy": 1.0, "effectiveness": 1.0}
    assert better["regressions"] == []
    evolve.decide(j, "promote", version=original, evidence=better["dir"])
    assert evolve.current(j) == original


def test_judge_prompts_that_do_not_validate_are_named(tmp_path):
    shutil.copytree(PROMPTS, tmp_path / "p")
    (tmp_path / "p" / "judge_user.md").write_text("{% for c in comments %}unclosed")
    system = (tmp_path / "p" / "judge_system.md").read_text()
    (tmp_path / "p" / "judge_system.md").write_text(system.replace('"effectiveness"', '"eff"'))
    with pytest.raises(hx.HarnessError) as err:
        evolve.judge_version(tmp_path / "p")
    assert [(p.file, p.field) for p in err.value.problems] == [
        ("judge_user.md", "line 1"),
        ("judge_system.md", "answer format"),
    ]
