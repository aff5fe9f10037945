"""`serve.release` / `launch.release`: the gates on synthetic evidence (evaluation runs with
per-item scores, replay summaries, both recording the checkpoint digest they ran), the
registry's history and current release; evidence of another checkpoint, or of none, and a
policy that only ever gives the Hooks' fallback are refused."""

import json
import subprocess
import sys

import numpy as np
import pytest

from serve import digest as dg
from serve import release as rel

SETS = ("t1", "t2", "general")


def _checkpoint(path, seed=0):
    """A small HF-like export (weights, config, tokenizer) with its digest manifest."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(np.random.default_rng(seed).bytes(256))
    (path / "config.json").write_text('{"model_type": "qwen3_5_moe"}')
    (path / "tokenizer.json").write_text("{}")
    return str(path), dg.write_digest(path)


def _eval_run(path, shift=None, harness="h1", n=60, digest="sha256:x", effectiveness=0.6):
    """An evaluation run: per-item `avg` scores of each set; `shift[set]` is added to them.
    `digest`: the checkpoint digest its policy recorded (None: a run from before digests)."""
    rng = np.random.default_rng(0)
    policy = {"kind": "jax", "checkpoint_digest": digest, "tokenizer_digest": "sha256:tok"}
    summary = {"run": {"harness": harness, "judge": {"kind": "rules"}, "policy": policy},
               "sets": {}}  # fmt: skip
    (path / "items").mkdir(parents=True)
    for name in SETS:
        scores = np.clip(rng.uniform(0.4, 0.9, n) + (shift or {}).get(name, 0.0), 0, 1)
        lines = [json.dumps({"id": f"{name}-{k}", "family": "f",
                             "scores": {"avg": float(s), "effectiveness": effectiveness}})
                 for k, s in enumerate(scores)]  # fmt: skip
        (path / "items" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        metrics = {"avg": float(scores.mean()), "effectiveness": effectiveness}
        summary["sets"][name] = {"version": f"{name}-v1", "metrics": metrics}
    (path / "summary.json").write_text(json.dumps(summary))
    return str(path)


def _replay_run(path, attainment=1.0, harness="h1", digest="sha256:x"):
    path.mkdir(parents=True)
    levels = {"1": {"attainment": 1.0, "slo_s": 15.0, "latency_p95_s": 2.0},
              "8": {"attainment": attainment, "slo_s": 15.0, "latency_p95_s": 9.0}}  # fmt: skip
    (path / "summary.json").write_text(json.dumps({"run_id": "x", "levels": levels}))
    manifest = {"run_id": "x", "harness_version": harness, "endpoint": "http://h:8000/v1",
                "model": "hat", "cases": {"set": "t1-dev"}, "checkpoint_digest": digest,
                "tokenizer_digest": "sha256:tok", "digest_source": "server info"}  # fmt: skip
    (path / "manifest.json").write_text(json.dumps(manifest))
    return str(path)


def _candidate(tmp_path, name, **kw):
    """A checkpoint with its evaluation and replay; `eval_digest` / `replay_digest` override
    the digest each run recorded (default: the checkpoint's own)."""
    checkpoint, digest = _checkpoint(tmp_path / name / "hf", seed=len(name))
    evaluated = kw.get("eval_digest", digest)
    return rel.Candidate(
        checkpoint=checkpoint,
        eval_run=_eval_run(
            tmp_path / name / "eval",
            kw.get("shift"),
            kw.get("harness", "h1"),
            digest=evaluated,
            effectiveness=kw.get("effectiveness", 0.6),
        ),  # fmt: skip
        replay_run=_replay_run(
            tmp_path / name / "replay",
            kw.get("attainment", 1.0),
            digest=kw.get("replay_digest", digest),
        ),  # fmt: skip
        serving={"engine": "sglang", "speculative": "NEXTN"},
    )


def test_first_release_then_a_regression_is_refused_and_a_good_one_released(tmp_path):
    registry = tmp_path / "registry"
    first = rel.release(_candidate(tmp_path, "a"), registry=registry)
    assert first["status"] == "released" and first["previous"] is None
    assert "first release" in first["gates"]["business"]["baseline"]
    assert first["binds"]["harness_version"] == "h1"
    assert first["binds"]["checkpoint_digest"] == dg.checkpoint_digest(first["binds"]["checkpoint"])
    assert first["gates"]["checkpoint"]["passed"]
    assert first["binds"]["serving"]["speculative"] == "NEXTN"
    assert rel.current_release(registry)["id"] == first["id"]

    worse = rel.release(_candidate(tmp_path, "b", shift={"t1": -0.15}), registry=registry)
    assert worse["status"] == "refused"
    business = worse["gates"]["business"]
    assert not business["passed"] and business["why"].startswith("t1:")
    assert "below zero" in business["why"] and business["sets"]["t1"]["high"] < 0
    assert business["sets"]["t2"]["low"] <= 0 <= business["sets"]["t2"]["high"]  # no change
    assert worse["gates"]["latency"]["passed"] and worse["gates"]["general"]["passed"]
    assert rel.current_release(registry)["id"] == first["id"]  # the last passing one stays

    better = rel.release(_candidate(tmp_path, "c", shift={"t1": 0.05}), registry=registry)
    assert better["status"] == "released" and better["previous"] == first["id"]
    assert rel.current_release(registry)["id"] == better["id"]
    history = json.loads((registry / rel.HISTORY).read_text())["decisions"]
    assert [d["status"] for d in history] == ["released", "refused", "released"]
    assert history[1]["failed"] == ["business"]
    assert sorted(p.name for p in (registry / rel.RELEASES).iterdir()) == sorted(
        f"{d['id']}.json" for d in history
    )
    assert not list(registry.rglob("*.tmp*"))  # every file written whole


def test_latency_and_general_gates_refuse_with_their_figures(tmp_path):
    registry = tmp_path / "registry"
    rel.release(_candidate(tmp_path, "a"), registry=registry)
    slow = rel.release(_candidate(tmp_path, "b", attainment=0.8), registry=registry)
    latency = slow["gates"]["latency"]
    assert slow["status"] == "refused" and not latency["passed"]
    assert (
        latency["concurrency"] == 8 and "attainment 0.800 at concurrency 8 < 0.95" in latency["why"]
    )
    forgetful = rel.release(_candidate(tmp_path, "c", shift={"general": -0.2}), registry=registry)
    assert forgetful["status"] == "refused" and "general:" in forgetful["gates"]["general"]["why"]


def test_evidence_must_exist_and_agree(tmp_path):
    candidate = _candidate(tmp_path, "a")
    mixed = rel.Candidate(candidate.checkpoint, candidate.eval_run,
                          _replay_run(tmp_path / "other", harness="h2"))  # fmt: skip
    with pytest.raises(ValueError, match="one Harness version"):
        rel.release(mixed, registry=tmp_path / "r")
    missing = rel.Candidate(candidate.checkpoint, candidate.eval_run, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="replay manifest"):
        rel.release(missing, registry=tmp_path / "r")
    gone = rel.Candidate(str(tmp_path / "no-ckpt"), candidate.eval_run, candidate.replay_run)
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        rel.release(gone, registry=tmp_path / "r")


def _refused_by_checkpoint(record):
    gate = record["gates"]["checkpoint"]
    assert record["status"] == "refused" and not gate["passed"]
    return gate


def test_an_evaluation_of_another_checkpoint_is_refused_naming_both_digests(tmp_path):
    registry = tmp_path / "registry"
    _, other = _checkpoint(tmp_path / "other", seed=99)
    record = rel.release(_candidate(tmp_path, "a", eval_digest=other), registry=registry)
    gate = _refused_by_checkpoint(record)
    mine = record["binds"]["checkpoint_digest"]
    assert other != mine and other in gate["why"] and mine in gate["why"]
    assert gate["why"].startswith("the evaluation run") and "replay" not in gate["why"]
    assert rel.current_release(registry) is None
    history = json.loads((registry / rel.HISTORY).read_text())["decisions"]
    assert history[0]["failed"] == ["checkpoint"]


def test_a_replay_of_another_checkpoint_is_refused_naming_both_digests(tmp_path):
    _, other = _checkpoint(tmp_path / "other", seed=99)
    record = rel.release(_candidate(tmp_path, "a", replay_digest=other), registry=tmp_path / "r")
    gate = _refused_by_checkpoint(record)
    assert gate["why"].startswith("the replay run") and "server info" in gate["why"]
    assert other in gate["why"] and record["binds"]["checkpoint_digest"] in gate["why"]


def test_runs_that_record_no_digest_are_refused(tmp_path):
    record = rel.release(_candidate(tmp_path, "a", eval_digest=None, replay_digest=None),
                         registry=tmp_path / "r")  # fmt: skip
    why = _refused_by_checkpoint(record)["why"]
    assert "the evaluation run" in why and "the replay run" in why
    assert why.count("records no checkpoint digest: it predates checkpoint digests") == 2


def test_a_changed_checkpoint_and_a_tokenizer_mismatch_are_refused(tmp_path):
    candidate = _candidate(tmp_path, "a")
    weights = tmp_path / "a" / "hf" / "model.safetensors"
    weights.write_bytes(b"\x01" + weights.read_bytes()[1:])  # after it was evaluated
    why = _refused_by_checkpoint(rel.release(candidate, registry=tmp_path / "r"))["why"]
    assert "hat_digest.json records" in why and "changed ['model.safetensors']" in why

    other = _candidate(tmp_path, "b")
    manifest = json.loads((tmp_path / "b" / "replay" / "manifest.json").read_text())
    manifest["tokenizer_digest"] = "sha256:another"
    (tmp_path / "b" / "replay" / "manifest.json").write_text(json.dumps(manifest))
    why = _refused_by_checkpoint(rel.release(other, registry=tmp_path / "r"))["why"]
    assert why == "the evaluation ran tokenizer sha256:tok but the replay's server sha256:another"


def test_a_fallback_only_policy_fails_the_default_business_floors(tmp_path):
    """Every reply the Hooks' fallback: Accuracy 1, Effectiveness 0, AVG 0.5 on T1 and T2."""
    candidate = _candidate(tmp_path, "a", effectiveness=0.0)
    summary_path = tmp_path / "a" / "eval" / "summary.json"
    summary = json.loads(summary_path.read_text())
    for name in ("t1", "t2"):
        summary["sets"][name]["metrics"].update(accuracy=1.0, effectiveness=0.0, avg=0.5)
        lines = [json.dumps({"id": f"{name}-{k}", "family": "f",
                             "scores": {"avg": 0.5, "effectiveness": 0.0}})
                 for k in range(60)]  # fmt: skip
        (tmp_path / "a" / "eval" / "items" / f"{name}.jsonl").write_text("\n".join(lines))
    summary_path.write_text(json.dumps(summary))
    record = rel.release(candidate, registry=tmp_path / "r")
    business = record["gates"]["business"]
    assert record["status"] == "refused" and not business["passed"]
    assert record["gates"]["checkpoint"]["passed"] and record["gates"]["latency"]["passed"]
    assert "t1: effectiveness 0.0 below the floor 0.1" in business["why"]
    assert "t2: effectiveness 0.0 below the floor 0.1" in business["why"]
    assert business["sets"]["t1"]["floors"]["avg"] == {"mean": 0.5, "floor": 0.5}
    # The AVG floor alone (the fallback's own figure) would let it through: the Effectiveness
    # floor is the one that refuses it.
    lenient = rel.GateConfig(min_effectiveness=0.0)
    assert rel.release(candidate, registry=tmp_path / "r2", gates=lenient)["status"] == "released"


def test_the_launch_script_exits_1_on_a_refusal(tmp_path):
    registry = tmp_path / "registry"
    rel.release(_candidate(tmp_path, "a"), registry=registry)
    bad = _candidate(tmp_path, "b", attainment=0.5)
    out = subprocess.run(
        [sys.executable, "-m", "launch.release", f"--checkpoint={bad.checkpoint}",
         f"--eval_run={bad.eval_run}", f"--replay_run={bad.replay_run}",
         f"--registry={registry}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert (
        "latency: FAIL attainment 0.500" in out.stdout and "current release stays r" in out.stdout
    )
    assert "checkpoint: pass" in out.stdout


def test_the_launch_script_refuses_another_checkpoints_evidence(tmp_path):
    _, other = _checkpoint(tmp_path / "other", seed=99)
    bad = _candidate(tmp_path, "a", replay_digest=other)
    out = subprocess.run(
        [sys.executable, "-m", "launch.release", f"--checkpoint={bad.checkpoint}",
         f"--eval_run={bad.eval_run}", f"--replay_run={bad.replay_run}",
         f"--registry={tmp_path / 'registry'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert "checkpoint: FAIL the replay run" in out.stdout and other in out.stdout
