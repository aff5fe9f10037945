"""`launch.pipeline`: the stages wired output to input, the ablation arms as differences from
HSA-SFT, the manifest and resume semantics (stage runners replaced by stand-ins), a failing
stage named in the manifest and the exit status, and (slow) the whole chain on the tiny model,
stopped between stages and killed (SIGKILL) inside one, then resumed: the stage killed inside
ends with an uninterrupted run's policy and metrics, bit for bit."""

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import jax
import pytest

from configs import ablations, pipeline_demo
from hat_jax import hsa, livestream, sharding
from launch import _pipeline
from launch import pipeline as pipeline_launch
from launch import sft as sft_launch
from tests import _kill

REPO = pathlib.Path(__file__).resolve().parents[1]
ONE_DEVICE = dict(devices=jax.devices()[:1])  # see tests/train/test_launch_sft.py


def _diff(a: dict, b: dict, prefix: str = "") -> set[str]:
    """The dotted keys where two nested dicts differ."""
    out = set()
    for key in set(a) | set(b):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out |= _diff(x, y, f"{prefix}{key}.")
        elif x != y:
            out.add(f"{prefix}{key}")
    return out


_FIXED = {"corpus.states", "sft.data.harness_mode", "sft.data.online_hsa_probability"}
_AGENTIC = {"rl.sim.original_fraction", "rl.sim.hsa_dims"}
EXPECTED = {
    "hsa_sft": set(),
    "fixed_sft": _FIXED,
    "hsa_sft_opd": {"stages"},
    "fixed_sft_opd": {"stages"} | _FIXED,
    "hsa_rl": {"stages"},
    "agentic_rl": {"stages"} | _AGENTIC,
    "fixed_sft_hsa_rl": {"stages"} | _FIXED,
    "fixed_sft_agentic_rl": {"stages"} | _FIXED | _AGENTIC,
} | {f"hsa_dim_{d}": {"corpus.hsa_dims", "sft.data.online_hsa_dims"} for d in hsa.Dim}


@pytest.mark.parametrize("arm", ablations.ARGS)
def test_an_arm_differs_from_hsa_sft_only_where_it_says(arm):
    reference = ablations.get_config("hsa_sft").to_dict()
    config = ablations.get_config(arm)
    renamed = {"workdir"} if arm != "hsa_sft" else set()
    assert _diff(config.to_dict(), reference) == EXPECTED[arm] | renamed
    assert config.workdir == f"runs/ablations/{arm}"
    wired = pipeline_launch.build(config)  # every stage's own launch module accepts it
    stages = _pipeline.parse_stages(config.stages)
    assert ("opd" in stages) == (arm.endswith("_opd") or arm.endswith("_rl"))
    if "rl" in stages:  # RL starts from SFT + OPD, as in the paper
        assert wired["rl"].policy.path.endswith("opd/checkpoints")
    online = sft_launch.build(wired["sft"]).data.online_hsa  # one dimension reaches online HSA
    assert online.dims == ((arm.removeprefix("hsa_dim_"),) if "_dim_" in arm else None)


def test_the_arms_cover_the_paper_and_every_hsa_dimension():
    assert set(ablations.ARGS) == set(EXPECTED)
    with pytest.raises(ValueError, match="unknown arm 'nope'"):
        ablations.get_config("nope")
    assert ablations.get_config("hsa_sft").to_dict() == ablations.get_config().to_dict()


def full_chain() -> object:
    """The demo pipeline: every stage."""
    c = pipeline_demo.get_config()
    assert _pipeline.parse_stages(c.stages) == _pipeline.STAGES
    return c


def test_each_stage_reads_the_previous_stages_output(tmp_path):
    c = full_chain()
    w = pipeline_launch.build(c, run_dir=str(tmp_path))
    base = str(tmp_path / "base" / "checkpoints")
    assert w["base"].data.corpus == str(tmp_path / "base" / "corpus")
    assert (w["base"].data.harness_mode, w["base"].data.eval_split) == ("general", "dev")
    assert (w["sft"].init.kind, w["sft"].init.path) == ("orbax", base)  # SFT starts from the base
    assert w["sft"].data.corpus == str(tmp_path / "corpus")
    assert w["opd"].policy.path == str(tmp_path / "sft" / "checkpoints")
    assert (w["opd"].teacher.kind, w["opd"].teacher.path) == ("orbax", base)  # OPD toward it
    scored = w["base"].evaluation  # the base's own evaluation, the final one's baseline
    assert (scored.sets, scored.policy.checkpoint) == ("general", base)
    assert w["eval"].baseline == scored.run_dir == str(tmp_path / "base" / "eval")
    assert scored.sets_dir == w["eval"].sets_dir and scored.sizes.general == c.eval.sizes.general
    room = c.get("room", "v0")  # one field selects the live room of every stage
    assert w["corpus"].room == w["rl"].sim.room == w["eval"].room == scored.room == room
    c.room = "v9"
    with pytest.raises(ValueError, match="unknown live room 'v9'"):
        _pipeline.wire(c, tmp_path)
    c.room = room
    c.base.general.train = 0
    with pytest.raises(ValueError, match="config.base.general: train >= 1"):
        pipeline_launch.build(c, run_dir=str(tmp_path))
    c.base.general.train = 4000
    c.base.general.lookup_share = 1.0
    with pytest.raises(ValueError, match="config.base.general.lookup_share=1.0"):
        pipeline_launch.build(c, run_dir=str(tmp_path))
    c.base.general.lookup_share = 0.0
    before = _pipeline._config_hash(w["base"])
    c.eval.sizes.t1 = 3  # a set the base does not run: its config (and hash) is unchanged
    assert _pipeline._config_hash(_pipeline.wire(c, tmp_path)["base"]) == before
    assert w["rl"].policy.path == str(tmp_path / "opd" / "checkpoints")
    assert (
        w["mtp"].policy.path == str(tmp_path / "rl" / "checkpoints") and not w["mtp"].export.hf_dir
    )
    assert w["mtp"].data.corpus == str(tmp_path / "corpus")  # the agent's own prompts
    assert (w["mtp"].data.split, w["mtp"].data.eval_split) == ("train", "dev")
    assert w["export"].checkpoint == w["mtp"].policy.path
    assert w["export"].mtp == str(tmp_path / "mtp" / "head")
    assert w["eval"].policy.checkpoint == w["export"].out == str(tmp_path / "export" / "hf")
    assert {w[s].run_dir for s in ("sft", "opd", "rl", "mtp", "eval")} == {
        str(tmp_path / s) for s in ("sft", "opd", "rl", "mtp", "eval")
    }
    c.stages = "sft,mtp"  # without OPD and RL the SFT policy goes straight to MTP
    w = _pipeline.wire(c, tmp_path)
    assert w["mtp"].policy.path == str(tmp_path / "sft" / "checkpoints")
    assert w["sft"].init.kind == "random" and not w["eval"].baseline  # no base stage
    assert w["sft"].data.corpus == c.sft.data.corpus  # no corpus stage: the block's own
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        _pipeline.parse_stages("sft,nope")


@pytest.fixture
def fake_runners(monkeypatch):
    """Every stage replaced by a stand-in that records its call and writes one file."""
    calls = []

    def runner(name):
        def run(block, mesh):
            calls.append(name)
            out = pathlib.Path(block.get("run_dir") or block.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "done").write_text(name)
            versions = {"corpus": {"train": {"records": 1}}} if name == "corpus" else {}
            return {"inputs": {"x": 1}, "outputs": {"dir": str(out)}, "versions": versions}

        return run

    for name in _pipeline.STAGES:
        monkeypatch.setitem(_pipeline.RUNNERS, name, runner(name))
    return calls


def test_complete_stages_are_skipped_and_a_failed_stage_is_named(fake_runners, tmp_path):
    c = full_chain()
    m = _pipeline.run_pipeline(c, workdir=str(tmp_path), only="base,corpus,sft",
                               log=lambda s: None)  # fmt: skip
    assert fake_runners == ["base", "corpus", "sft"] and m["status"] == "partial"

    def broken(block, mesh):
        raise ValueError("no teacher here")

    _pipeline.RUNNERS["rl"] = broken
    with pytest.raises(_pipeline.StageFailed, match="stage 'rl' failed: ValueError: no teacher"):
        _pipeline.run_pipeline(c, workdir=str(tmp_path), log=lambda s: None)
    assert fake_runners == ["base", "corpus", "sft", "opd"]  # base, corpus and sft skipped
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["status"] == "failed" and m["failed_stage"] == "rl"
    assert m["entries"]["rl"]["error"] == "ValueError: no teacher here"
    assert not (tmp_path / "rl" / "COMPLETE.json").exists()
    assert (tmp_path / "opd" / "COMPLETE.json").exists() and (tmp_path / "sft" / "done").exists()
    assert [i["skipped"] for i in m["invocations"]] == [[], ["base", "corpus", "sft"]]
    report = (tmp_path / "report.md").read_text()  # rewritten with the manifest
    assert "status **failed** (failed stage: `rl`)" in report
    assert "| rl | failed |" in report and "failed: ValueError: no teacher here" in report
    # A complete stage whose config changed is refused, never mixed with the new one.
    c.sft.trainer.total_steps = 99
    with pytest.raises(_pipeline.StageFailed, match="stage 'sft' failed: it completed with"):
        _pipeline.run_pipeline(c, workdir=str(tmp_path), log=lambda s: None)


def test_the_manifest_of_a_whole_run(fake_runners, tmp_path):
    c = full_chain()
    m = _pipeline.run_pipeline(c, workdir=str(tmp_path), log=lambda s: None)
    assert fake_runners == list(_pipeline.STAGES) and m["status"] == "complete"
    assert m == json.loads((tmp_path / "manifest.json").read_text())
    for name, entry in m["entries"].items():
        assert entry["status"] == "complete", name
        assert {"inputs", "outputs", "config", "config_hash", "started", "ended"} <= set(entry)
        assert entry["seconds"] >= 0
    assert m["entries"]["sft"]["config"]["data"]["corpus"] == str(tmp_path / "corpus")
    assert m["versions"]["corpus"] == {"train": {"records": 1}}
    assert len(m["versions"]["harness"]["version"]) > 6
    assert m["versions"]["git"] is None or len(m["versions"]["git"]["commit"]) == 40
    report = (tmp_path / "report.md").read_text()
    assert "status **complete**" in report and m["versions"]["harness"]["version"] in report
    for name in _pipeline.STAGES:
        assert f"| {name} | complete |" in report and f"(`{name}`)" in report, name
    # Another run skips everything; with an earlier stage's marker removed, the complete later
    # stages would describe its old output: refused, naming them.
    again = _pipeline.run_pipeline(c, workdir=str(tmp_path), log=lambda s: None)
    assert fake_runners == list(_pipeline.STAGES) and again["invocations"][-1]["ran"] == []
    mtp = tmp_path / "mtp" / "COMPLETE.json"
    record = mtp.read_text()
    mtp.unlink()
    with pytest.raises(_pipeline.StageFailed, match="stages \\['export', 'eval'\\] were made"):
        _pipeline.run_pipeline(c, workdir=str(tmp_path), log=lambda s: None)
    mtp.write_text(record)
    (tmp_path / "eval" / "COMPLETE.json").unlink()  # the last stage alone runs again
    _pipeline.run_pipeline(c, workdir=str(tmp_path), log=lambda s: None)
    assert fake_runners[-1] == "eval" and len(fake_runners) == len(_pipeline.STAGES) + 1
    mtp.unlink()  # a stage selected alone whose input is not complete is refused
    (tmp_path / "export" / "COMPLETE.json").unlink()
    with pytest.raises(_pipeline.StageFailed, match="input comes from \\['mtp'\\]"):
        _pipeline.run_pipeline(c, workdir=str(tmp_path), only="export", log=lambda s: None)


def test_a_failed_stage_exits_non_zero_naming_it(tmp_path):
    cmd = [sys.executable, "-m", "launch.pipeline", "--config=configs/pipeline_demo.py",
           f"--workdir={tmp_path}", "--config.stages=sft", "--stages=sft",
           f"--config.sft.data.corpus={tmp_path / 'nowhere'}"]  # fmt: skip
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "pipeline: stage 'sft' failed: FileNotFoundError" in run.stderr
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["failed_stage"] == "sft" and "launch.make_corpus" in m["entries"]["sft"]["error"]


def tiny_pipeline(room: str = "v0") -> object:
    """The whole pipeline at its smallest: 1-4 steps per stage, two scenarios, two one-item
    sets, in `room` (the micro room with its model preset)."""
    c = full_chain()
    c.room = room
    # Rows as long as the room's longest conversation (the micro room's are a third of v0's).
    rows = livestream.room(room).token_budget if room == "micro" else None
    if room == "micro":
        c.base.model.preset = "micro"
    c.base.general.update(dict(train=24, dev=4))
    quiet = dict(log_every=1, eval_every=0, checkpoint_every=1, progress=False, plots=False)
    c.base.trainer.update(dict(total_steps=2, batch_size=1, seq_len=256) | quiet)
    c.base.optimizer.update(dict(warmup_steps=0, decay_steps=2))
    c.corpus.update(dict(num_scenarios=2, dev_scenarios=0, states_per_scenario=2, num_shards=1))
    c.sft.trainer.update(dict(total_steps=1, batch_size=1, seq_len=rows or 5120) | quiet)
    c.sft.optimizer.update(dict(warmup_steps=0, decay_steps=1))
    c.opd.data.update(dict(heldout_instructions=4, max_prompt_len=44))
    c.opd.sampling.max_new_tokens = 8
    c.opd.eval.samples = 1
    c.opd.trainer.update(dict(total_steps=4, batch_size=4, seq_len=52) | quiet)
    c.rl.rollout.update(dict(scenarios=1, group_size=2, max_tokens=8))
    c.rl.sim.max_rounds = 2
    c.rl.eval.update(dict(scenarios=1, trajectories=1))
    c.rl.trainer.update(dict(total_steps=1, batch_size=4, seq_len=rows or 4608) | quiet)
    c.mtp.data.update(dict(source="instructions", heldout_instructions=4, max_prompt_len=96))
    c.mtp.rollout.update(dict(batch_size=2, batches=1, eval_batches=1, max_new_tokens=8))
    c.mtp.trainer.update(dict(total_steps=1, batch_size=2, seq_len=104) | quiet)
    c.mtp.measure_speculative = False
    c.eval.sets = "t1,general"
    c.eval.sizes.update(dict(t1=1, general=1))
    c.eval.sampling.max_tokens = 8
    c.eval.limits.max_rounds = 2
    return c


# The rest of the pipeline in a child process, which the test kills (SIGKILL) inside OPD.
_CHILD = """
import sys
sys.path.insert(0, "tests")
import jax
from hat_jax import sharding
from launch import _pipeline
from test_launch_pipeline import tiny_pipeline
c = tiny_pipeline("micro")
c.eval.sets_dir = sys.argv[1] + "/sets"
mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
_pipeline.run_pipeline(c, workdir=sys.argv[1] + "/run", mesh=mesh, log=print)
"""


@pytest.mark.slow
def test_the_whole_pipeline_killed_between_stages_and_inside_one_then_resumed(tmp_path):
    """In the micro live room, so the room reaches every stage (the stages' own tests and the
    reproduction's run Harness v0)."""
    c = tiny_pipeline("micro")
    c.eval.sets_dir = str(tmp_path / "sets")
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    run = dict(workdir=str(tmp_path / "run"), mesh=mesh, log=lambda s: None)
    # Stopped between stages: only the base, the corpus and SFT ran.
    _pipeline.run_pipeline(c, only="base,corpus,sft", **run)
    sft_entry = json.loads((tmp_path / "run" / "sft" / "COMPLETE.json").read_text())
    # Killed inside OPD: a process running the rest gets SIGKILL once OPD's step-1
    # checkpoint is committed (its remaining steps keep it busy for a while after that).
    # Its output goes to a file, unbuffered: a pipe nobody reads until the end blocks the
    # child once full, and a killed child's buffered lines are lost.
    child_log = tmp_path / "child.log"
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    with child_log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], cwd=REPO,
                                 env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    first = tmp_path / "run" / "opd" / "checkpoints" / "1"
    deadline = time.monotonic() + 900
    while not first.is_dir():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            child.wait()
            pytest.fail(f"the child ended before OPD's first checkpoint: {child_log.read_text()}")
        time.sleep(0.05)
    child.kill()
    child.wait()
    assert not (tmp_path / "run" / "opd" / "COMPLETE.json").exists()
    killed = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert killed["entries"]["opd"]["status"] == "running"  # it never got to close its record
    m = _pipeline.run_pipeline(c, **run)
    assert m["status"] == "complete"
    assert [i["ran"] for i in m["invocations"]] == [
        ["base", "corpus", "sft"], ["opd"], ["opd", "rl", "mtp", "export", "eval"]
    ]  # fmt: skip
    assert [i["status"] for i in m["invocations"]] == ["complete", "interrupted", "complete"]
    assert m["entries"]["sft"] == sft_entry  # skipped: its record is the first run's
    total = c.opd.trainer.total_steps
    assert 1 <= m["entries"]["opd"]["result"]["resumed_from"] < total
    assert m["entries"]["opd"]["result"]["step"] == total
    for name, entry in m["entries"].items():
        assert entry["status"] == "complete" and entry["outputs"] and entry["seconds"] > 0, name
    v = m["versions"]
    assert (
        v["corpus"]["train"]["records"] > 0 and len(v["corpus"]["train"]["manifest_sha256"]) == 64
    )
    assert set(v["eval_sets"]) == {"t1", "general"} and v["harness"]["version"]
    assert m["room"] == v["harness"]["room"] == v["corpus"]["train"]["room"] == c.room
    assert v["general_corpus"]["train"]["records"] == 24
    base = m["entries"]["base"]
    assert base["outputs"]["eval"] == str(tmp_path / "run" / "base" / "eval" / "report.md")
    assert m["entries"]["opd"]["inputs"]["teacher"].startswith(
        f"orbax:{tmp_path / 'run' / 'base' / 'checkpoints'}"
    )
    assert pathlib.Path(m["entries"]["export"]["outputs"]["hf_dir"], "config.json").is_file()
    assert (tmp_path / "run" / "eval" / "report.md").is_file()
    report = (tmp_path / "run" / "report.md").read_text()
    diff = float(re.search(r"max \|logits diff\| vs ours (\S+)", report).group(1))
    assert diff <= c.export.max_logit_diff  # the export stage reloaded it with transformers
    assert "### t1" in report and "](eval/plots/t1.png)" in report  # the eval's tables, linked
    assert "Against the baseline" in report  # the general set, item by item against the base
    assert "general corpus: train 24, dev 4 records (answers checked" in report
    # Its first section: the final policy on T1 with an interval, and SFT's curve.
    outcome = report.split("## What the final policy does", 1)[1].split("| stage |", 1)[0]
    assert re.search(r"\*\*T1\*\* \(1 items, live room \w+\): AVG \*\*[\d.]+\*\* \(95% interval",
                     outcome)  # fmt: skip
    # The stage killed inside, resumed by the pipeline, ends where an uninterrupted OPD from
    # the same SFT policy and teacher ends, bit for bit: run again, uninterrupted, with the
    # resumed one and the stages made from it moved aside. (RL and MTP after it read its
    # policy; their own resume is their kill tests', in tests/test_launch_kill.py.)
    resumed, straight = tmp_path / "resumed", tmp_path / "run"
    resumed.mkdir()
    for stage in ("opd", "rl", "mtp", "export", "eval"):
        (straight / stage).rename(resumed / stage)
    again = _pipeline.run_pipeline(c, only="opd", **run)
    assert again["invocations"][-1]["ran"] == ["opd"]
    _kill.assert_same_params(straight / "opd", resumed / "opd", "checkpoints")
    _kill.assert_same_metrics(straight / "opd", resumed / "opd")
