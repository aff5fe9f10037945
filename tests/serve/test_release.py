"""`serve.release` / `launch.release`: the three gates on synthetic evidence (evaluation runs
with per-item scores, replay summaries), the registry's history and current release."""

import json
import subprocess
import sys

import numpy as np
import pytest

from serve import release as rel

SETS = ("t1", "t2", "general")


def _eval_run(path, shift=None, harness="h1", n=60):
    """An evaluation run: per-item `avg` scores of each set; `shift[set]` is added to them."""
    rng = np.random.default_rng(0)
    summary = {"run": {"harness": harness, "judge": {"kind": "rules"}}, "sets": {}}
    (path / "items").mkdir(parents=True)
    for name in SETS:
        scores = np.clip(rng.uniform(0.4, 0.9, n) + (shift or {}).get(name, 0.0), 0, 1)
        lines = [json.dumps({"id": f"{name}-{k}", "family": "f", "scores": {"avg": float(s)}})
                 for k, s in enumerate(scores)]  # fmt: skip
        (path / "items" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        summary["sets"][name] = {"version": f"{name}-v1", "metrics": {"avg": float(scores.mean())}}
    (path / "summary.json").write_text(json.dumps(summary))
    return str(path)


def _replay_run(path, attainment=1.0, harness="h1"):
    path.mkdir(parents=True)
    levels = {"1": {"attainment": 1.0, "slo_s": 15.0, "latency_p95_s": 2.0},
              "8": {"attainment": attainment, "slo_s": 15.0, "latency_p95_s": 9.0}}  # fmt: skip
    (path / "summary.json").write_text(json.dumps({"run_id": "x", "levels": levels}))
    manifest = {"run_id": "x", "harness_version": harness, "endpoint": "http://h:8000/v1",
                "model": "hat", "cases": {"set": "t1-dev"}}  # fmt: skip
    (path / "manifest.json").write_text(json.dumps(manifest))
    return str(path)


def _candidate(tmp_path, name, **kw):
    checkpoint = tmp_path / name / "hf"
    checkpoint.mkdir(parents=True)
    return rel.Candidate(
        checkpoint=str(checkpoint),
        eval_run=_eval_run(tmp_path / name / "eval", kw.get("shift"), kw.get("harness", "h1")),
        replay_run=_replay_run(tmp_path / name / "replay", kw.get("attainment", 1.0)),
        serving={"engine": "sglang", "speculative": "NEXTN"},
    )


def test_first_release_then_a_regression_is_refused_and_a_good_one_released(tmp_path):
    registry = tmp_path / "registry"
    first = rel.release(_candidate(tmp_path, "a"), registry=registry)
    assert first["status"] == "released" and first["previous"] is None
    assert "first release" in first["gates"]["business"]["baseline"]
    assert first["binds"]["harness_version"] == "h1"
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
