"""The Harness evolution loop end to end on the bundled world, offline: a damaged Harness is
diagnosed, the rule proposer's edit fixes the cluster, the evaluation shows the gain and flags
regressing categories, decisions are recorded, rollback restores a version byte for byte."""

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import types

import httpx
import pytest

from hat_jax import evolve, livestream
from launch.eval import policy_for

SOURCE = pathlib.Path(livestream.default_world_dir()) / "harness"
CONTRACT = {"format", "harness_version", "eval_run_dir", "clusters", "stopping_rule"}
CLUSTER_KEYS = {"id", "category", "cause", "count", "share", "examples"}


@pytest.fixture(scope="module")
def teacher():
    return policy_for(types.SimpleNamespace(kind="teacher"))


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    return evolve.DevSplit(size=24, sets_dir=str(tmp_path_factory.mktemp("sets")))


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """The bundled Harness as it is when the tests start (a byte-for-byte reference)."""
    folder = tmp_path_factory.mktemp("original") / "harness"
    shutil.copytree(SOURCE, folder)
    return folder


def damaged(original, tmp_path, *edits):
    """A copy of the Harness with `edits` applied: ("rm_tool", skill, tool) or ("rm_skill", s)."""
    folder = tmp_path / f"damaged-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(original, folder)
    (folder / "manifest.json").unlink()
    for edit in edits:
        if edit[0] == "rm_skill":
            shutil.rmtree(folder / "skills" / edit[1])
        else:
            path = folder / "skills" / edit[1] / "SKILL.md"
            lines = path.read_text().splitlines(keepends=True)
            lines = [
                " ".join(w for w in ln.split() if w != edit[2]) + "\n"
                if ln.startswith("allowed-tools:")
                else ln
                for ln in lines
            ]
            path.write_text("".join(lines))
    return folder


def promote_damage(evolve_dir, folder, teacher, split):
    """An operator's edit that broke something, promoted on its evaluation."""
    version = evolve.store(evolve_dir, folder)
    evaluation = evolve.evaluate(evolve_dir, version, teacher, split)
    evolve.decide(evolve_dir, "promote", version=version, evidence=evaluation["dir"])
    return version, evaluation


@pytest.fixture(scope="module")
def refused_tool(tmp_path_factory, original, teacher, split):
    """An evolution folder whose current version lost `get_price_promotion` from product-qa's
    allowed tools (promoted on its evaluation), its first version and the damaged folder."""
    tmp = tmp_path_factory.mktemp("refused")
    e = tmp / "evolve"
    v0 = evolve.init(e, original)
    bad_dir = damaged(original, tmp, ("rm_tool", "product-qa", "get_price_promotion"))
    bad, evaluation = promote_damage(e, bad_dir, teacher, split)
    return types.SimpleNamespace(dir=e, v0=v0, bad=bad, bad_dir=bad_dir, evaluation=evaluation)


@pytest.fixture
def refused(tmp_path, refused_tool):
    """A private copy of `refused_tool`'s folder (its runs included)."""
    shutil.copytree(refused_tool.dir, tmp_path / "evolve")
    return tmp_path / "evolve"


def tree(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_refused_tool_is_diagnosed_fixed_promoted_and_rolled_back(
    tmp_path, original, teacher, split, refused_tool, refused
):
    e, v0, bad, bad_dir = refused, refused_tool.v0, refused_tool.bad, refused_tool.bad_dir
    damage = refused_tool.evaluation
    assert damage["total"]["delta"] < 0 and "price_promotion" in damage["regressions"]

    report = evolve.diagnose(e, teacher, split, tmp_path / "diag")
    on_disk = json.loads((tmp_path / "diag" / "failures.json").read_text())
    assert set(on_disk) == CONTRACT and on_disk["format"] == 1
    assert on_disk["harness_version"] == bad
    top = on_disk["clusters"][0]
    assert set(top) == CLUSTER_KEYS and top["id"] == "c1"
    assert (top["category"], top["cause"]) == (
        "price_promotion",
        "hook require_skill_permission: get_price_promotion",
    )
    assert top["count"] >= 3 and top["share"] == round(top["count"] / report["items"], 4)
    assert set(top["examples"][0]) == {"run_dir", "set", "item_id"}
    assert "## c1: price_promotion" in (tmp_path / "diag" / "failures.md").read_text()

    proposal = evolve.propose(e, tmp_path / "diag", evolve.RuleProposer())
    assert "+allowed-tools: " in proposal["diff"] and "get_price_promotion\n" in proposal["diff"]
    assert "skills/product-qa/SKILL.md" in proposal["diff"]
    fixed = proposal["version"]
    assert fixed not in (bad, None) and evolve.current(e) == bad  # nothing promoted

    evaluation = evolve.evaluate(e, fixed, teacher, split)
    assert evaluation["total"]["delta"] > 0 and evaluation["total"]["low"] > 0
    assert evaluation["categories"]["price_promotion"]["delta"] > 0
    assert evaluation["regressions"] == []
    assert evolve.diagnose(e, teacher, split, tmp_path / "diag2", version=fixed)["clusters"] == []

    entry = evolve.decide(e, "promote", version=fixed, evidence=evaluation["dir"], note="ok")
    assert evolve.current(e) == fixed
    assert entry["who"] and entry["at"] and entry["evidence"] == evaluation["dir"]
    evolve.decide(e, "rollback", note="back to the last promoted")
    assert evolve.current(e) == bad
    evolve.checkout(e, tmp_path / "deployed")
    assert {k: v for k, v in tree(tmp_path / "deployed").items() if k != "manifest.json"} == tree(
        bad_dir
    )
    evolve.decide(e, "rollback")
    assert evolve.current(e) == v0
    evolve.checkout(e, tmp_path / "deployed")
    assert tree(tmp_path / "deployed") == tree(original)
    actions = [h.get("action") for h in evolve.history(e) if h["event"] == "decided"]
    assert actions == ["promote", "promote", "rollback", "rollback"]


def test_a_removed_skill_is_restored_from_the_last_promoted_version(
    tmp_path, original, teacher, split
):
    e = tmp_path / "evolve"
    v0 = evolve.init(e, original)
    promote_damage(e, damaged(original, tmp_path, ("rm_skill", "chit-chat")), teacher, split)
    report = evolve.diagnose(e, teacher, split, tmp_path / "diag")
    assert report["clusters"][0]["cause"] == "skill unavailable: chit-chat"
    proposal = evolve.propose(e, tmp_path / "diag", evolve.RuleProposer())
    assert "+++ b/skills/chit-chat/SKILL.md" in proposal["diff"]
    assert proposal["version"] == v0  # the restored Harness is the one promoted before
    evaluation = evolve.evaluate(e, proposal["version"], teacher, split)
    assert evaluation["total"]["delta"] > 0 and evaluation["regressions"] == []


def test_a_regressing_category_is_flagged_and_the_stopping_rule_reported(
    tmp_path, original, teacher, split
):
    e = tmp_path / "evolve"
    evolve.init(e, original)
    promote_damage(e, damaged(original, tmp_path, ("rm_skill", "chit-chat")), teacher, split)
    # A candidate that brings the Skill back but loses a tool elsewhere: the total improves.
    mixed = evolve.store(
        e, damaged(original, tmp_path, ("rm_tool", "product-qa", "get_price_promotion"))
    )
    evaluation = evolve.evaluate(e, mixed, teacher, split)
    assert evaluation["total"]["delta"] > 0
    assert "price_promotion" in evaluation["regressions"]
    md = (pathlib.Path(evaluation["dir"]) / "evaluation.md").read_text()
    assert "REGRESSED" in md and "Regressing categories: price_promotion" in md

    evolve.decide(e, "promote", version=mixed, evidence=evaluation["dir"])
    sparse = evolve.diagnose(e, teacher, split, tmp_path / "d1", max_share=0.5)
    assert "more harm than good" in sparse["stopping_rule"]
    assert "price_promotion" in sparse["stopping_rule"]
    systematic = evolve.diagnose(e, teacher, split, tmp_path / "d2", max_share=0.01)
    assert systematic["stopping_rule"] is None


class _BrokenProposer:
    def edit(self, cluster, work, evidence):
        path = work / "skills" / "product-qa" / "SKILL.md"
        path.write_text(path.read_text().replace("allowed-tools: ", "allowed-tools: no_such_tool "))
        return "adds a tool the registry does not know"


def test_a_proposal_that_does_not_validate_never_becomes_a_version(
    tmp_path, teacher, split, refused
):
    e = refused
    evolve.diagnose(e, teacher, split, tmp_path / "diag")
    before = sorted((e / "versions").iterdir())
    with pytest.raises(evolve.ProposalInvalid) as err:
        evolve.propose(e, tmp_path / "diag", _BrokenProposer())
    problem = err.value.problems[0]
    assert (problem.file, problem.field) == ("skills/product-qa/SKILL.md", "allowed-tools")
    assert "no_such_tool" in str(err.value)
    assert sorted((e / "versions").iterdir()) == before
    assert evolve.history(e)[-1]["event"] == "rejected"


def test_a_corrupt_results_line_is_named_and_the_rest_diagnosed(tmp_path, teacher, split, refused):
    e = refused
    whole = evolve.diagnose(e, teacher, split, tmp_path / "whole")
    run_dir = pathlib.Path(whole["eval_run_dir"])
    path = run_dir / "items" / "t1-dev.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"
    path.write_text("".join(lines))
    report = evolve.diagnose_run(run_dir, tmp_path / "partial")
    assert report["bad_lines"] == [report["bad_lines"][0]]
    assert f"{path}:2: not an evaluation result" in report["bad_lines"][0]
    assert report["items"] == whole["items"] - 1
    assert report["clusters"][0]["cause"] == whole["clusters"][0]["cause"]
    assert f"{path}:2" in (tmp_path / "partial" / "failures.md").read_text()


def test_decisions_need_their_evidence(tmp_path, original):
    e = tmp_path / "evolve"
    v0 = evolve.init(e, original)
    with pytest.raises(evolve.RegistryError, match="already has a current version"):
        evolve.init(e, original)
    with pytest.raises(evolve.RegistryError, match="nothing to roll back"):
        evolve.decide(e, "rollback")
    other = evolve.store(e, damaged(original, tmp_path, ("rm_skill", "chit-chat")))
    with pytest.raises(evolve.RegistryError, match="needs --evidence"):
        evolve.decide(e, "promote", version=other)
    with pytest.raises(evolve.RegistryError, match="no Harness version"):
        evolve.decide(e, "revise", version="0" * 16)
    with pytest.raises(evolve.RegistryError, match="unknown decision"):
        evolve.decide(e, "ship", version=other)
    assert evolve.decide(e, "revise", version=other)["action"] == "revise"
    assert evolve.current(e) == v0


def test_cause_names_the_skill_hook_tool_or_reward():
    def rec(traj=None, **details):
        return {"scores": {"avg": 0.5, "accuracy": 1.0, "effectiveness": 0.5},
                "trajectory": traj, "details": details}  # fmt: skip

    masked = {"faults": [{"kind": "policy_error", "detail": "masked"}]}
    reasons = {"skill_selection": ["missing one of ['chit-chat', 'general-reply']"]}
    assert evolve.cause(rec(masked, reasons=reasons)) == "skill unavailable: chit-chat"
    hook = {"hook_events": [{"hook": "reply_length", "outcome": "retry", "subject": "getP",
                             "point": "before_reply"}],
            "renames": {"tools": {"getP": "get_price_promotion"}}}  # fmt: skip
    assert evolve.cause(rec(hook)) == "hook reply_length: get_price_promotion"
    tool = {"tool_calls": [{"error": "timeout", "canonical": "check_inventory", "name": "x"}]}
    assert evolve.cause(rec(tool)) == "tool timeout: check_inventory"
    why = {"effectiveness": ["intent i0 (price) misses ['i0.f1']"]}
    assert evolve.cause(rec({}, reasons=why)) == "effectiveness: intent # (price) misses ['#']"
    judged = {"votes": [{"reason": "the reply skips the 2nd question"}]}
    assert (
        evolve.cause(rec({}, judge=judged))
        == "judge effectiveness: the reply skips the Nnd question"
    )


@pytest.mark.slow
def test_launch_evolve_runs_each_command(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "launch.evolve", *args,
                               f"--evolve_dir={tmp_path / 'e'}", "--size=8"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    diag = run("diagnose")
    assert diag.returncode == 0, diag.stderr
    assert "current version" in diag.stdout and "failures of 16 items" in diag.stdout
    refused = run("decide", "--action=rollback")
    assert refused.returncode == 1 and "nothing to roll back" in refused.stderr


def test_the_model_proposer_edits_whole_files_inside_the_harness(tmp_path, original):
    e = tmp_path / "evolve"
    evolve.init(e, original)
    report = {"format": 1, "harness_version": "x", "eval_run_dir": str(tmp_path / "none"),
              "stopping_rule": None, "clusters": [
                  {"id": f"c{k}", "category": "price_promotion", "cause": cause, "count": 3,
                   "share": 0.1, "examples": []}
                  for k, cause in enumerate(("fault max_rounds", "fault budget"), 1)]}  # fmt: skip
    (tmp_path / "diag").mkdir()
    (tmp_path / "diag" / "failures.json").write_text(json.dumps(report))
    skill = "skills/product-qa/SKILL.md"
    edited = (original / skill).read_text().replace("# Product QA", "# Product QA (edited)")
    seen = []

    def answer(request):
        body = json.loads(request.content)
        seen.append(body["messages"][1]["content"])
        files = {skill: edited} if len(seen) == 1 else {"../outside.md": "x"}
        content = json.dumps({"why": "name the Skill", "files": files})
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    proposer = evolve.LLMProposer("http://model/v1", "m", transport=httpx.MockTransport(answer))
    result = evolve.propose(e, tmp_path / "diag", proposer)
    assert "cause fault max_rounds" in seen[0] and f"=== {skill}" in seen[0]
    assert "+# Product QA (edited)" in result["diff"]
    assert [s["cause"] for s in result["skipped"]] == ["fault budget"]  # the escaping edit
    assert not (tmp_path / "outside.md").exists()
    assert evolve.current(e) != result["version"]


def test_a_judged_dev_run_records_the_panel(refused, split, teacher, tmp_path):
    from rl.rewards import JudgeEndpoint, JudgePanel

    panel = JudgePanel([JudgeEndpoint(base_url="http://scripted/v1", model="scripted")],
                       transport=httpx.MockTransport(evolve.ScriptedJudge()))  # fmt: skip
    judged = dataclasses.replace(split, judge=panel)
    report = evolve.diagnose(refused, teacher, judged, tmp_path / "diag")
    assert report["eval_run_dir"] != str(evolve.run_dir_for(refused, report["harness_version"],
                                                            teacher, split))  # fmt: skip
    summary = json.loads((pathlib.Path(report["eval_run_dir"]) / "summary.json").read_text())
    assert summary["run"]["judge"]["kind"] == "panel"
    # The judge counts an honest follow-up after the refused tool as an answer (its rubric).
    rules = evolve.diagnose(refused, teacher, split, tmp_path / "rules")
    assert sum(c["count"] for c in report["clusters"]) < sum(c["count"] for c in rules["clusters"])
