"""`python -m launch.simulate`: episodes, rewards per family, files written."""

import json
import pathlib
import subprocess
import sys

import pytest

from hat_jax import harness as hx
from rl import sim

REPO = pathlib.Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.simulate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_teacher_and_rules_policies(tmp_path):
    out = tmp_path / "teacher"
    proc = _run(
        "--episodes",
        "12",
        "--out",
        str(out),
        "--faults",
        "0.1,0.1,0.05",
        "--export_scenarios",
        str(tmp_path / "scenarios.jsonl"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 12 and all(r["rewards"]["accuracy"] == 1.0 for r in records)
    assert len(hx.read_trajectories(out / "trajectories.jsonl")) == 12
    summary = json.loads((out / "summary.json").read_text())
    assert sum(row["episodes"] for row in summary.values()) == 12
    assert len(sim.read_scenarios(tmp_path / "scenarios.jsonl")) == len(sim.default_scenarios())

    rules = tmp_path / "rules"
    proc = _run(
        "--episodes",
        "6",
        "--policy",
        "rules",
        "--split",
        "test",
        "--out",
        str(rules),
        "--proportions",
        "price_promotion=1,stock=1",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    families = {
        r["scenario"].split("/")[0]
        for r in map(json.loads, (rules / "episodes.jsonl").read_text().splitlines())
    }
    assert families <= {"price_promotion", "stock"}
    assert "episodes written to" in proc.stdout


def test_bad_flags_are_usage_errors():
    proc = _run("--episodes", "1", "--faults", "0.1")
    assert proc.returncode != 0 and "--faults takes three rates" in proc.stderr
