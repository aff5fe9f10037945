"""`launch.reproduce`: the arms as a tree of pipeline runs (each starts from its parent's
policy, shares the set versions), the effect verdicts on hand-made comparisons, the report
from stand-in evaluations, and (slow) the tree on the tiny model."""

import json
import pathlib
import sys

import jax
import numpy as np
import pytest

from configs import reproduce
from hat_jax import files, sharding
from launch import _pipeline, _reproduce, _reproduce_report
from launch import reproduce as reproduce_launch

sys.path.append(str(pathlib.Path(__file__).parent))  # the pipeline test's tiny stage blocks
from test_launch_pipeline import tiny_pipeline  # noqa: E402

EDITS = pathlib.Path(__file__).resolve().parents[1] / "data" / "livestream" / "harness_edits"


def test_each_arm_starts_from_its_parent_and_shares_the_sets(tmp_path):
    c = reproduce.get_config()
    configs = reproduce_launch.build(c, run_dir=str(tmp_path))
    assert list(configs) == c.arms.split(",")
    base_policy = str(tmp_path / "base" / "base" / "checkpoints")
    for arm, p in configs.items():
        node = _reproduce.NODES[arm]
        assert p.workdir == str(tmp_path / arm) and p.stages == node.stages
        assert p.eval.sets == c.sets and p.eval.sets_dir == str(tmp_path / "sets")
        wired = _pipeline.wire(p, pathlib.Path(p.workdir))
        if arm == "base":
            assert wired["base"].evaluation.sets == c.sets  # the base row: every set
            assert wired["base"].evaluation.sets_dir == str(tmp_path / "sets")
            continue
        parent = str(_reproduce.policy_dir(tmp_path, node.parent))
        stage = p.stages.split(",")[-2]  # the node's trained stage, before its evaluation
        start = {"sft": wired["sft"].init, "opd": wired["opd"].policy, "rl": wired["rl"].policy}
        assert (start[stage].kind, start[stage].path) == ("orbax", parent), arm
        assert wired["eval"].policy.checkpoint == str(tmp_path / arm / stage / "checkpoints")
        assert wired["eval"].baseline == str(_reproduce.eval_dir(tmp_path, node.parent))
        if stage == "opd":
            assert wired["opd"].teacher.path == base_policy  # OPD distils toward the base
        fixed = wired["sft"].data.harness_mode == "fixed"
        assert fixed == (arm == "fixed_sft") if stage == "sft" else True
        if stage == "sft":
            assert wired["sft"].data.corpus == str(tmp_path / arm / "corpus")
            assert (wired["sft"].data.online_hsa_probability == 0) == fixed
    c.pipeline.room = "micro"  # the Harness-edit test's cases and edits are Harness v0's
    with pytest.raises(ValueError, match="edit_test runs on Harness v0's cases"):
        reproduce_launch.build(c, run_dir=str(tmp_path))
        if stage == "rl":  # Agentic RL: the original Harness in every episode
            agentic = arm.endswith("agentic_rl")
            assert (wired["rl"].sim.original_fraction == 1.0) == agentic
    # Apart from the inputs and what the arm names, the arms share every stage's block.
    hsa, fixed = configs["hsa_sft"].to_dict(), configs["fixed_sft"].to_dict()
    assert hsa["sft"]["trainer"] == fixed["sft"]["trainer"] and hsa["eval"] == {
        **fixed["eval"],
        "policy": hsa["eval"]["policy"],
        "baseline": hsa["eval"]["baseline"],
    }


def test_arms_are_checked():
    assert _reproduce.parse_arms("hsa_sft, base") == ("base", "hsa_sft")
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        _reproduce.parse_arms("base,nope")
    with pytest.raises(ValueError, match="start from an arm not listed \\(\\['hsa_sft'\\]\\)"):
        _reproduce.parse_arms("base,hsa_sft_opd")
    c = reproduce.get_config()
    c.resamples = 10
    with pytest.raises(ValueError, match="resamples >= 100"):
        reproduce_launch.build(c)
    with pytest.raises(ValueError, match="takes no variant"):
        reproduce.get_config("x")


def _boot(delta: float, low: float, high: float, a: float = 0.5) -> dict:
    return {"delta": delta, "low": low, "high": high, "mean_a": a, "mean_b": a + delta,
            "p_le_zero": 0.5, "n": 10}  # fmt: skip


@pytest.mark.parametrize(
    "direction, interval, verdict",
    [
        ("+", (0.01, 0.2), "reproduces"),
        ("+", (-0.01, 0.2), "not shown"),
        ("+", (-0.3, -0.01), "opposite"),
        ("-", (-0.3, -0.01), "reproduces"),
        ("-", (0.01, 0.3), "opposite"),
        ("=", (-0.04, 0.03), "reproduces"),  # within the margin of 0.05
        ("=", (-0.2, 0.1), "not shown"),  # holds 0 but too wide to call level
        ("=", (0.01, 0.04), "reproduces"),  # a difference, but within the margin
        ("=", (0.01, 0.2), "opposite"),  # a difference beyond the margin
    ],
)
def test_an_effect_reproduces_only_when_its_interval_says_so(direction, interval, verdict):
    e = _reproduce.Effect("x", "a", "b", "t1", direction)
    low, high = interval
    got = _reproduce.effect_verdict(e, {"a|b": _boot((low + high) / 2, low, high)}, 0.05)
    assert got["verdict"] == verdict
    assert _reproduce.effect_verdict(e, {}, 0.05)["verdict"] == "not run"


def test_an_agent_effect_needs_an_arm_that_does_the_task():
    e = _reproduce.Effect("x", "a", "b", "t1", "=")
    level = {"a|b": _boot(0.0, 0.0, 0.0)}  # both arms alike on every item
    got = _reproduce.effect_verdict(e, level, 0.05, {"a": 0.0, "b": 0.05}, 0.1)
    assert got["verdict"] == "task not learned" and got["effectiveness"] == [0.0, 0.05]
    got = _reproduce.effect_verdict(e, level, 0.05, {"a": 0.0, "b": 0.4}, 0.1)
    assert got["verdict"] == "reproduces"
    # The report words every verdict the tree can give.
    assert set(_reproduce_report._VERDICTS) == set(_reproduce.VERDICTS)


def test_recovery_needs_half_the_loss_back():
    e = _reproduce.Effect("x", "sft", "opd", "general", "+", recovers="base")
    lost = {"base|sft": _boot(-0.4, -0.5, -0.3)}  # SFT lost 0.4 of the base's score
    most = _reproduce.effect_verdict(e, lost | {"sft|opd": _boot(0.3, 0.1, 0.5)}, 0.05)
    assert most["verdict"] == "reproduces" and most["recovered_share"] == pytest.approx(0.75)
    some = _reproduce.effect_verdict(e, lost | {"sft|opd": _boot(0.1, 0.02, 0.2)}, 0.05)
    assert some["verdict"] == "not shown" and some["recovered_share"] == pytest.approx(0.25)
    assert _reproduce.effect_verdict(e, {"sft|opd": _boot(0.3, 0.1, 0.5)}, 0.05)["verdict"] == (
        "not run")  # fmt: skip


def _fake_eval(run: pathlib.Path, scores: dict[str, list[float]], names=None) -> None:
    """An evaluation run directory with the given per-item `avg` scores per set (and the
    names-written counts `names[set]`, `hat_jax.eval._names`)."""
    sets = {}
    for name, values in scores.items():
        rows = [{"id": f"{name}-{i}", "set": name, "family": "f", "scores": {"avg": v}}
                for i, v in enumerate(values)]  # fmt: skip
        files.write_jsonl(run / "items" / f"{name}.jsonl", [json.dumps(r) for r in rows])
        sets[name] = {"version": f"{name}-v1", "n": len(values),
                      "metrics": {"avg": float(np.mean(values))}}  # fmt: skip
        if names and name in names:
            sets[name]["names"] = names[name]
    files.write_json(run / "summary.json", {"run": {"judge": {"kind": "rules"}}, "sets": sets})


# Held-out Harness-edit test stand-in: bad replies per (phase, arm, edit), out of the cases.
EDIT_ERRORS = {
    ("dev", "fixed_sft", "original"): 8, ("dev", "hsa_sft_opd_hsa_rl", "original"): 6,
    ("dev", "fixed_sft", "confident-facts"): 7, ("dev", "hsa_sft_opd_hsa_rl", "confident-facts"): 5,
    ("dev", "fixed_sft", "host-voice"): 4, ("dev", "hsa_sft_opd_hsa_rl", "host-voice"): 2,
    ("dev", "fixed_sft", "warm-handover"): 5, ("dev", "hsa_sft_opd_hsa_rl", "warm-handover"): 1,
    ("heldout", "fixed_sft", "original"): 10, ("heldout", "hsa_sft_opd_hsa_rl", "original"): 10,
    ("heldout", "fixed_sft", "host-voice"): 8, ("heldout", "hsa_sft_opd_hsa_rl", "host-voice"): 4,
}  # fmt: skip


@pytest.fixture
def fake_edit_runs(monkeypatch):
    """`launch.eval.run` replaced: writes the run's items with EDIT_ERRORS bad replies."""
    from launch import eval as eval_launch

    calls = []

    def run(e, *, run_dir):
        out = pathlib.Path(run_dir)
        key = (out.parent.parent.name, out.parent.name, out.name)
        calls.append((*key, e.harness_edit))
        name = "t1" if e.split == "test" else f"t1-{e.split}"
        rows = [{"id": f"{name}-{i}", "set": name, "family": "f", "scores": {"avg": 1.0},
                 "output": "Maybe size M, I am not sure." if i < EDIT_ERRORS[key] else
                 "Size M is in stock tonight!"} for i in range(e.sizes.t1)]  # fmt: skip
        files.write_jsonl(out / "items" / f"{name}.jsonl", [json.dumps(r) for r in rows])

    monkeypatch.setattr(eval_launch, "run", run)
    return calls


def test_the_edit_is_chosen_on_dev_and_measured_held_out(tmp_path, fake_edit_runs):
    from launch import _edit_test

    c = reproduce.get_config()
    c.edit_test.update(dict(dev_cases=10, heldout_cases=20))
    policies = {"fixed_sft": "ckpt/a", "hsa_sft_opd_hsa_rl": "ckpt/b"}
    r = _edit_test.run_edit_test(c.edit_test, eval_block=c.pipeline.eval, policies=policies,
                                 root=tmp_path, resamples=1000, seed=0, log=lambda s: None)  # fmt: skip
    assert [k[:3] for k in fake_edit_runs[:8]] == [
        ("dev", arm, name) for name in ("original", "confident-facts", "host-voice",
                                        "warm-handover") for arm in policies]  # fmt: skip
    assert all(k[3].endswith(f"{k[2]}.yaml") for k in fake_edit_runs if k[2] != "original")
    # host-voice and warm-handover tie at 6 dev errors: the first listed is chosen.
    assert r["chosen"] == "host-voice" and r["chosen_beats_original_on_dev"]
    assert r["dev"]["original"]["fixed_sft"] == {"cases": 10, "errors": 8,
                                                 "problems": {"uncertainty": 8}}  # fmt: skip
    assert fake_edit_runs[8:] == [("heldout", arm, name, edit) for arm in policies for name, edit in
                                  (("original", ""), ("host-voice", r["candidates"]["host-voice"]
                                                      ["source"]))]  # fmt: skip
    fixed, hat = r["heldout"]["fixed_sft"], r["heldout"]["hsa_sft_opd_hsa_rl"]
    assert (fixed["before"]["errors"], fixed["after"]["errors"]) == (10, 8)
    assert fixed["reduction"] == pytest.approx(0.2) and hat["reduction"] == pytest.approx(0.6)
    assert hat["error_rate_change"]["delta"] == pytest.approx(-0.3)
    assert hat["error_rate_change"]["high"] < 0  # six cases fixed, none broken
    assert fixed["error_rate_change"]["high"] == 0.0  # two fixed: some resamples hold neither
    assert len({v["harness"] for v in r["candidates"].values()} | {r["released"]}) == 4


def test_bad_edit_test_settings_are_named(tmp_path):
    c = reproduce.get_config()
    c.edit_test.arms = "fixed_sft,nope"
    with pytest.raises(ValueError, match="edit_test.arms: \\['nope'\\] are not among"):
        reproduce_launch.build(c, run_dir=str(tmp_path))
    c.edit_test.arms = "fixed_sft"
    c.edit_test.candidates = str(tmp_path / "none")
    with pytest.raises(FileNotFoundError, match="neither a file nor a folder"):
        reproduce_launch.build(c, run_dir=str(tmp_path))
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "a.yaml").write_text("name: a\nskills: [{skill: nope, add: [x]}]\n")
    c.edit_test.candidates = str(tmp_path / "e")
    with pytest.raises(ValueError, match="no Skill 'nope'"):
        reproduce_launch.build(c, run_dir=str(tmp_path))


def test_the_report_from_stand_in_evaluations(tmp_path, monkeypatch, fake_edit_runs):
    c = reproduce.get_config()
    c.sets = "t1,t2,general"
    c.arms = "base,fixed_sft,hsa_sft,fixed_sft_opd,hsa_sft_opd,hsa_sft_opd_hsa_rl"
    c.resamples = 1000
    c.edit_test.update(dict(dev_cases=10, heldout_cases=20))
    n = 40
    ones, zeros = [1.0] * n, [0.0] * n
    half = [1.0, 0.0] * (n // 2)
    scores = {  # hand-made: every effect's direction except RL's
        "base": {"t1": zeros, "t2": zeros, "general": ones},
        "fixed_sft": {"t1": half, "t2": zeros, "general": zeros},
        "hsa_sft": {"t1": half, "t2": half, "general": zeros},
        "fixed_sft_opd": {"t1": half, "t2": zeros, "general": half},  # recovers half
        "hsa_sft_opd": {"t1": half, "t2": half, "general": [1.0] * 30 + [0.0] * 10},
        "hsa_sft_opd_hsa_rl": {"t1": half, "t2": half, "general": half},
    }
    calls = []

    def run_pipeline(p, *, workdir, mesh=None, log=print):
        arm = pathlib.Path(workdir).name
        calls.append(arm)
        _fake_eval(_reproduce.eval_dir(tmp_path, arm), scores[arm], names.get(arm))
        return {"status": "complete", "entries": {s: {"seconds": 1.0} for s in p.stages.split(",")}}

    names = {  # T2 names written: Fixed-SFT memorised, HSA-SFT copies most
        "fixed_sft": {"t2": {"tool/listed": 0, "tool/training": 8, "tool/unknown": 3}},
        "hsa_sft": {"t2": {"tool/listed": 6, "tool/training": 2, "skill/listed": 1}},
    }

    monkeypatch.setattr(_pipeline, "run_pipeline", run_pipeline)
    m = _reproduce.run_reproduce(c, workdir=str(tmp_path), log=lambda s: None)
    assert calls == c.arms.split(",") and m["status"] == "complete"
    assert m == json.loads((tmp_path / "reproduce.json").read_text())
    verdicts = {e["effect"]: e["verdict"] for e in m["effects"]}
    assert verdicts == {
        "HSA-SFT above Fixed-SFT on T2 (held-out Harness edits)": "reproduces",
        "HSA-SFT level with Fixed-SFT on T1 (original Harness)": "reproduces",
        "Fixed-SFT below the base on the general set": "reproduces",
        "OPD recovers most of Fixed-SFT's general loss": "reproduces",  # exactly half
        "OPD recovers most of HSA-SFT's general loss": "reproduces",  # three quarters
        "HSA-RL above its start (HSA-SFT + OPD) on T1": "not shown",  # level
        "HSA-RL above its start (HSA-SFT + OPD) on T2": "not shown",
    }
    rl_general = m["comparisons"]["hsa_sft_opd|hsa_sft_opd_hsa_rl"]["general"]
    assert rl_general["delta"] == pytest.approx(-0.25) and rl_general["n"] == n
    assert "fixed_sft|hsa_sft" in m["comparisons"] and "base|hsa_sft" in m["comparisons"]
    report = (tmp_path / "report.md").read_text()
    assert "status **complete**" in report and (tmp_path / "plots" / "table3.png").is_file()
    assert "| HSA-SFT | 50.0 [" in report and "| Base | 0.0 [0.0, 0.0] | 0.0 [0.0, 0.0] | 100.0" in (
        report)  # fmt: skip
    assert "| OPD recovers most of HSA-SFT's general loss | general | +75.0" in report
    assert "75% of the loss recovered | reproduces |" in report
    names_section = report.split("## Names under renames", 1)[1].split("\n## ", 1)[0]
    assert "| Fixed-SFT | t2 | 0 / 8 (0.0) | 0 / 0 (-) |" in names_section
    assert "| HSA-SFT | t2 | 6 / 2 (75.0) | 1 / 0 (100.0) |" in names_section
    assert names_section.count("| t2 |") == 2  # arms and sets without renames: no row
    assert m["edit_test"]["chosen"] == "host-voice"
    assert "Chosen and frozen: **host-voice** (fewer dev errors" in report
    assert "| HSA-SFT + OPD + HSA-RL | 10 / 20 | 4 / 20 | 60.0% | -30.0 (" in report


def test_a_failed_arm_is_named_and_the_earlier_ones_kept(tmp_path, monkeypatch):
    c = reproduce.get_config()
    c.arms = "base,hsa_sft"
    c.edit_test.arms = ""

    def run_pipeline(p, *, workdir, mesh=None, log=print):
        if p.stages != "base":
            raise _pipeline.StageFailed("sft", "ValueError: no corpus")
        return {"status": "complete", "entries": {"base": {"seconds": 2.0}}}

    monkeypatch.setattr(_pipeline, "run_pipeline", run_pipeline)
    with pytest.raises(_pipeline.StageFailed, match="stage 'sft' failed"):
        _reproduce.run_reproduce(c, workdir=str(tmp_path), log=lambda s: None)
    m = json.loads((tmp_path / "reproduce.json").read_text())
    assert m["status"] == "failed" and m["failed_arm"] == "hsa_sft"
    assert (
        m["arms"]["base"]["status"] == "complete" and "no corpus" in m["arms"]["hsa_sft"]["error"]
    )
    assert "(failed arm: `hsa_sft`)" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_the_tree_on_the_tiny_model(tmp_path):
    c = reproduce.get_config()
    c.pipeline = tiny_pipeline()
    c.pipeline.eval.sizes.update(dict(t1=2, general=2))
    c.sets = "t1,general"
    # Every kind of node: the base, both SFT arms from it, OPD from an arm's policy (RL from
    # one is the pipeline's own test); the edit test on two arms.
    c.arms = "base,fixed_sft,hsa_sft,hsa_sft_opd"
    c.resamples = 200
    c.edit_test.update(dict(arms="fixed_sft,hsa_sft_opd", candidates=str(EDITS / "host-voice.yaml"),
                            dev_cases=1, heldout_cases=1))  # fmt: skip
    reproduce_launch.build(c, run_dir=str(tmp_path))
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    m = _reproduce.run_reproduce(c, workdir=str(tmp_path), mesh=mesh, log=lambda s: None)
    assert m["status"] == "complete"
    for arm, entry in m["arms"].items():
        assert entry["status"] == "complete", arm
        run = json.loads((tmp_path / arm / "manifest.json").read_text())
        assert run["status"] == "complete" and pathlib.Path(entry["eval"], "summary.json").is_file()
    versions = {json.loads(pathlib.Path(e["eval"], "summary.json").read_text())["sets"]["t1"]
                ["version"] for e in m["arms"].values()}  # fmt: skip
    assert len(versions) == 1  # every arm on the same items
    assert {e["verdict"] for e in m["effects"]} <= set(_reproduce.VERDICTS)
    assert all(e["verdict"] == "not run" for e in m["effects"] if e["set"] == "t2")  # not run
    assert m["comparisons"]["base|hsa_sft"]["general"]["n"] == 2
    # A second run skips every complete stage (resumable), and reports the same.
    again = _reproduce.run_reproduce(c, workdir=str(tmp_path), mesh=mesh, log=lambda s: None)
    assert again["comparisons"] == m["comparisons"]
    for arm in m["arms"]:
        run = json.loads((tmp_path / arm / "manifest.json").read_text())
        assert run["invocations"][-1]["ran"] == [], arm
    assert "## The paper's effects" in (tmp_path / "report.md").read_text()
    edits = m["edit_test"]
    assert edits["chosen"] == "host-voice" and set(edits["heldout"]) == {"fixed_sft",
                                                                        "hsa_sft_opd"}  # fmt: skip
    run = json.loads((tmp_path / "edit_test/heldout/fixed_sft/host-voice/summary.json").read_text())
    assert run["run"]["harness_edit"]["name"] == "host-voice"
