"""`python -m launch.agent`: one comment, or a file of comments in multi-comment mode."""

import json
import pathlib
import subprocess
import sys

import pytest

from hat_jax import harness as hx

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "launch.agent", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_one_comment(tmp_path):
    out = tmp_path / "t.jsonl"
    stdout = _run("--comment", "how much is the serum?", "--mcp", "inprocess", "--out", str(out))
    assert "spoken: @lily_loves_skincare, HydraSilk Hyaluronic Serum 30 ml is ¥149" in stdout
    (traj,) = hx.read_trajectories(out)
    assert traj.spoken.endswith("limit 2 per order.") and traj.harness["release"] == "v0"


@pytest.mark.slow
def test_comment_file_in_multi_mode(tmp_path):
    comments = [
        {"text": "how much is the serum?", "viewer_id": "v1001", "handle": "lily", "ts": 0},
        {"text": "serum price please", "viewer_id": "v1002", "handle": "annie", "ts": 4},
        {
            "text": "any coupon for the smart watch?",
            "viewer_id": "v1011",
            "handle": "tom",
            "ts": 60,
        },
        {
            "text": "where is my order DD2606150034",
            "viewer_id": "v1001",
            "handle": "lily",
            "ts": 200,
        },
        {"text": "one more coupon for me?", "viewer_id": "v1011", "handle": "tom", "ts": 400},
    ]
    path = tmp_path / "comments.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in comments))
    out = tmp_path / "t.jsonl"
    stdout = _run(
        "--comments_file", str(path), "--mode", "multi", "--mcp", "inprocess", "--out", str(out)
    )
    trajs = hx.read_trajectories(out)
    assert len(trajs) == 4
    assert [c["handle"] for c in trajs[0].request["comments"]] == ["lily", "annie"]
    assert "¥30 off coupon" in trajs[1].spoken
    assert trajs[2].final.private_to == "v1001" and "private to v1001" in stdout
    assert trajs[2].request["context"]["history"][0]["handle"] == "lily"  # dialogue carries over
    # One coupon per viewer in the session (the Harness's rule), across requests of the run.
    assert any("per viewer in a session" in e.detail for e in trajs[3].hook_events)
    issued = [r for t in trajs for r in t.tool_calls if r.canonical == "issue_coupon"]
    assert [r.error for r in issued] == [None, "not_allowed"], issued  # the second refused


@pytest.mark.slow
def test_plain_text_file_without_marketing(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("hi!\n\ncan I get a coupon?\n")
    stdout = _run("--comments_file", str(path), "--mcp", "none", "--out", str(tmp_path / "t.jsonl"))
    assert stdout.count("spoken:") == 2
    coupon = hx.read_trajectories(tmp_path / "t.jsonl")[1]
    assert [r.error for r in coupon.tool_calls if r.canonical == "issue_coupon"] == ["no_executor"]


@pytest.mark.slow
def test_the_micro_room_answers_with_its_own_harness(tmp_path):
    out = tmp_path / "t.jsonl"
    stdout = _run("--room", "micro", "--comment", "how much is the serum?", "--mcp", "inprocess",
                  "--out", str(out))  # fmt: skip
    assert "Room micro: Harness livestream-micro micro-v0" in stdout
    assert "spoken: @lily_loves_skincare, HydraSilk Hyaluronic Serum 30 ml is ¥149" in stdout
    (traj,) = hx.read_trajectories(out)
    assert traj.harness["name"] == "livestream-micro" and traj.harness["release"] == "micro-v0"
    assert "search_products" not in traj.model_calls[0].tools  # v0 has it, micro does not


def test_an_unknown_room_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "launch.agent", "--room", "v9", "--comment", "hi"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "--room" in proc.stderr and "micro" in proc.stderr
