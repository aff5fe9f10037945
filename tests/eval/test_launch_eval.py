"""`launch.eval` as a user runs it: a tiny trained-format checkpoint (Orbax, and its HF export)
evaluated end to end on small versions of the sets, from the command line and in-process, with
identical scores; the scripted teacher as the ceiling; bad input refused by name (a tokenizer
that does not fit the checkpoint, a pinned set version that is not stored, a missing
checkpoint); `launch.simulate` and `launch.agent` with `--policy jax`."""

import json
import pathlib
import subprocess
import sys

import pytest
from flax import nnx

import models
from configs import eval_demo
from data.tokenizer import load_tokenizer
from hat_jax.checkpoint import save_params
from hat_jax.eval import SetVersionError, read_items
from launch import eval as eval_launch

REPO = pathlib.Path(__file__).resolve().parents[2]
SIZES = dict(t1=2, t2=1, t3_tool=1, t3_prompt=1, general=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random tiny policy saved as a `save_params` checkpoint, and its HF export."""
    from serve import convert

    root = tmp_path_factory.mktemp("ckpt")
    tok = load_tokenizer()
    config = models.QwenConfig.preset("tiny").replace(vocab_size=-(-len(tok) // 128) * 128)
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    save_params(root / "orbax", nnx.state(model, nnx.Param), model_config=config.to_dict())
    convert.save_hf(model, config, root / "hf", tokenizer_dir=REPO / "data" / "tokenizer",
                    dtype="float32", progress=False)  # fmt: skip
    return root


def _config(tmp_path, variant, **policy):
    c = eval_demo.get_config(variant)
    c.run_dir = str(tmp_path / variant)
    c.sets_dir = str(tmp_path / "sets")
    c.sizes.update(SIZES)
    c.sampling.max_tokens = 12
    # A random model never closes a think block within 12 tokens: replies would all be empty.
    c.sampling.enable_thinking = False
    c.batch_size = 8
    c.limits.max_rounds = 2
    c.policy.update(policy)
    return c


def _scores(run_dir):
    summary = json.loads((pathlib.Path(run_dir) / "summary.json").read_text())
    return {
        name: [r["scores"] for r in read_items(run_dir, name)] for name in summary["sets"]
    }, summary


@pytest.mark.slow
def test_a_jax_checkpoint_from_the_cli_and_in_process_scores_the_same(checkpoint, tmp_path):
    # The JAX policy on a live-room set and the general set (the other kinds run the same
    # runner path; their scorers have their own tests and the teacher runs them below).
    c = _config(tmp_path, "sft", checkpoint=str(checkpoint / "orbax"))
    c.sets = "t1,general"
    cli = subprocess.run(
        [sys.executable, "-m", "launch.eval", "--config=configs/eval_demo.py",
         f"--config.run_dir={tmp_path / 'cli'}", f"--config.sets_dir={tmp_path / 'sets'}",
         f"--config.policy.checkpoint={checkpoint / 'orbax'}", "--config.sampling.max_tokens=12",
         "--config.sampling.enable_thinking=False",
         "--config.batch_size=8", "--config.limits.max_rounds=2", "--config.sets=t1,general",
         *(f"--config.sizes.{k}={v}" for k, v in SIZES.items())],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "eval: t1 (t1-" in cli.stdout
    eval_launch.run(c)
    a, summary = _scores(tmp_path / "cli")
    b, _ = _scores(c.run_dir)
    assert a == b and set(a) == {"t1", "general"}
    assert summary["run"]["policy"]["kind"] == "jax"
    assert summary["run"]["policy"]["format"] == "orbax"
    from serve import digest

    orbax_digest = digest.checkpoint_digest(checkpoint / "orbax")
    assert summary["run"]["policy"]["checkpoint_digest"] == orbax_digest
    # Resuming that run directory with another checkpoint would mix their results: refused.
    with pytest.raises(ValueError, match="holds results of checkpoint sha256:") as err:
        eval_launch.run(_config(tmp_path, "sft", checkpoint=str(checkpoint / "hf"),
                                dtype="float32"))  # fmt: skip
    assert orbax_digest in str(err.value) and digest.checkpoint_digest(checkpoint / "hf") in str(
        err.value
    )
    report = (tmp_path / "cli" / "report.md").read_text()
    assert "## general" in report and (tmp_path / "cli" / "plots" / "t1.png").is_file()
    # The HF export of the same weights decodes the same replies (the short general prompts).
    hf = _config(tmp_path, "hf", checkpoint=str(checkpoint / "hf"), dtype="float32")
    hf.sets = "general"
    eval_launch.run(hf)
    out_a = [r["output"] for r in read_items(c.run_dir, "general")]
    out_b = [r["output"] for r in read_items(hf.run_dir, "general")]
    assert out_a == out_b and any(out_a)
    hf_policy = json.loads((tmp_path / "hf" / "summary.json").read_text())["run"]["policy"]
    assert hf_policy["checkpoint_digest"] == digest.read_manifest(checkpoint / "hf")["digest"]


@pytest.mark.slow
def test_the_teacher_is_the_ceiling_on_t1_and_t2(tmp_path):
    c = _config(tmp_path, "teacher")
    eval_launch.run(c)  # builds the sets; then calibrate the rule scorer on human labels
    first = read_items(c.run_dir, "t1")[0]["id"]
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"item_id": first, "dimension": "accuracy", "label": 0}) + "\n")
    c.calibration.labels = str(labels)
    summary = eval_launch.run(c)
    calibration = json.loads((tmp_path / "teacher" / "calibration.json").read_text())
    assert calibration["accuracy"]["rules"]["n"] == 1
    assert calibration["accuracy"]["rules"]["agreement"] == 0.0  # the rules said 1
    assert (tmp_path / "teacher" / "calibration.md").is_file()
    for name in ("t1", "t2"):
        assert summary["sets"][name]["metrics"]["avg"] == 1.0, name
    assert set(summary["sets"]) == {"t1", "t2", "t3_tool", "t3_prompt"}
    assert "answers live-room requests only" in summary["skipped"]["general"]
    assert "Not evaluated: teacher answers" in (tmp_path / "teacher" / "report.md").read_text()


def test_bad_inputs_are_named(checkpoint, tmp_path):
    small = models.QwenConfig.preset("tiny").replace(vocab_size=256)
    save_params(tmp_path / "small", nnx.state(models.Qwen(small, rngs=nnx.Rngs(0)), nnx.Param),
                model_config=small.to_dict())  # fmt: skip
    with pytest.raises(ValueError, match=r"tokenizer \(\d+ tokens.*vocabulary of 256"):
        eval_launch.run(_config(tmp_path, "sft", checkpoint=str(tmp_path / "small")))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        eval_launch.run(_config(tmp_path, "sft", checkpoint=str(tmp_path / "nowhere")))
    c = _config(tmp_path, "teacher")
    c.sets = "t1"
    c.versions.t1 = "t1-000000000000"
    with pytest.raises(SetVersionError, match="t1-000000000000"):
        eval_launch.run(c)
    c.versions.t1 = ""
    c.sets = "t1,nope"
    with pytest.raises(ValueError, match="nope"):
        eval_launch.run(c)
    c.sets = "t1"
    c.judge.endpoints = "http://localhost:9/v1"
    with pytest.raises(ValueError, match="is not 'base_url|model'"):
        eval_launch.run(c)


def test_the_same_items_under_a_harness_edit(tmp_path):
    from hat_jax import harness as hx
    from hat_jax.eval import compare_runs

    edit_file = REPO / "data" / "livestream" / "harness_edits" / "host-voice.yaml"
    before = _config(tmp_path, "teacher")
    before.sets = "t1"
    eval_launch.run(before)
    after = _config(tmp_path, "teacher")
    after.update(dict(sets="t1", run_dir=str(tmp_path / "edited"), harness_edit=str(edit_file)))
    summary = eval_launch.run(after)
    edit = hx.load_edit(edit_file)
    assert summary["run"]["harness_edit"] == edit.describe()
    released = json.loads((tmp_path / "teacher" / "summary.json").read_text())["run"]["harness"]
    assert summary["run"]["harness"] != released  # the edited Harness's own version
    assert summary["sets"]["t1"]["metrics"]["avg"] == 1.0  # the teacher still solves them
    paired = compare_runs(tmp_path / "teacher", tmp_path / "edited")  # the same items
    assert paired["t1"]["avg"].n == SIZES["t1"]
    after.harness_edit = str(tmp_path / "nowhere.yaml")
    with pytest.raises(FileNotFoundError, match="Harness edit .*nowhere.yaml: no such file"):
        eval_launch.run(after)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["simulate", "agent"])
def test_simulate_and_agent_take_a_jax_checkpoint(checkpoint, tmp_path, script):
    args = {
        "simulate": ["--episodes", "1", "--out", str(tmp_path / "sim")],
        "agent": ["--comment", "how much is the serum?", "--mcp", "inprocess", "--max_rounds",
                  "1", "--out", str(tmp_path / "agent.jsonl"), "--budget_s", "600"],
    }[script]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", f"launch.{script}", "--policy", "jax",
         "--checkpoint", str(checkpoint / "hf"), "--max_tokens", "8", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'kind': 'jax'" in proc.stdout and "'format': 'hf'" in proc.stdout


def test_a_run_resumes_only_under_its_checkpoint_and_an_endpoint_reports_its_own(tmp_path):
    """`check_resume` on a run's recorded digest; `endpoint_digests` of a server reporting one."""
    from serve._engine import BatchEngine
    from serve.server import ServedModel, create_app, serve_in_background
    from tests.serve.test_server import ScriptedSampler

    run = tmp_path / "run"
    run.mkdir()
    policy = {"kind": "jax", "checkpoint": "a", "checkpoint_digest": "sha256:a"}
    (run / "summary.json").write_text(json.dumps({"run": {"policy": policy}, "sets": {}}))
    eval_launch.check_resume(run, dict(policy))  # the same checkpoint resumes
    eval_launch.check_resume(tmp_path / "new", {"kind": "teacher"})  # a new run directory
    with pytest.raises(ValueError, match="sha256:a .*not of sha256:b"):
        eval_launch.check_resume(run, {**policy, "checkpoint_digest": "sha256:b"})
    with pytest.raises(ValueError, match="not of no digest"):
        eval_launch.check_resume(run, {"kind": "teacher"})

    tok = load_tokenizer()
    info = {"checkpoint_digest": "sha256:served", "tokenizer_digest": "sha256:tok"}
    served = ServedModel("p", tok, BatchEngine(ScriptedSampler(tok, "hi"), [0]), info=info)
    with serve_in_background(create_app(served)) as url:
        assert eval_launch.endpoint_digests(f"{url}/v1", "p", None)["checkpoint_digest"] == (
            "sha256:served"
        )
    assert eval_launch.endpoint_digests("http://127.0.0.1:9/v1", "p", None) == {}
