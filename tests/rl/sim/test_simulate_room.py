"""`python -m launch.simulate --room micro`: the micro room's Harness and scenario pool, the
scripted teacher solving its episodes, the room recorded in every episode and the manifest."""

import json
import pathlib
import subprocess
import sys

import pytest

from hat_jax import harness as hx

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_teacher_in_the_micro_room(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "launch.simulate", "--room", "micro", "--episodes", "4",
         "--split", "test", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Room micro: Harness livestream-micro micro-v0" in proc.stdout
    records = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["room"] for r in records} == {"micro"}
    for r in records:  # the micro pool's scenarios (its phrasing ids start with "m-"), solved
        assert r["scenario"].split("/")[1].startswith("m-"), r["scenario"]
        assert r["rewards"]["accuracy"] == r["rewards"]["effectiveness"] == 1.0, r["scenario"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["room"] == "micro" and manifest["split"] == "test"
    assert manifest["harness"]["name"] == "livestream-micro" and manifest["episodes"] == 4
    assert len(hx.read_trajectories(tmp_path / "trajectories.jsonl")) == 4


def test_an_unknown_room_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "launch.simulate", "--room", "v9", "--episodes", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "--room" in proc.stderr and "micro" in proc.stderr
