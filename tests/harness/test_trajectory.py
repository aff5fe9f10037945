"""Trajectories: JSON round trip, atomic JSONL writes, reading back with clear errors."""

import json

import pytest

from hat_jax import harness as hx
from hat_jax import livestream


@pytest.fixture
def trajectories(state, world, tools, request_for):
    policy = livestream.RuleBasedPolicy(state, world)
    texts = ["how much is the serum?", "hi!", "where is my order DD2606150034"]
    return [hx.run_agent(state, request_for(t), policy, tools) for t in texts]


def test_json_roundtrip_is_exact(trajectories):
    for traj in trajectories:
        data = json.loads(traj.to_json())
        back = hx.Trajectory.from_dict(data)
        assert back == traj
        assert back.to_json() == traj.to_json()
        assert back.final.public == traj.spoken and back.rounds == traj.rounds


def test_record_contents(trajectories, harness):
    price, hello, order = trajectories
    data = json.loads(price.to_json())
    assert data["harness"]["version"] == harness.version
    assert data["request"]["context"]["product"]["id"] == "BT-001"
    assert data["model_calls"][0]["messages"][0]["role"] == "system"
    assert data["model_calls"][0]["output"]["tool_calls"][0]["function"]["name"] == "load_skill"
    assert {"total_s", "model_s", "tool_s", "overhead_s", "rounds"} <= set(data["timings"])
    assert order.final.private and "SF1460099812" in order.final.private
    assert "SF1460099812" not in (order.spoken or "")


def test_write_read_append_atomic(trajectories, tmp_path):
    path = tmp_path / "runs" / "t.jsonl"
    hx.write_trajectories(path, trajectories[:2])
    hx.write_trajectories(path, trajectories[2:], append=True)
    back = hx.read_trajectories(path)
    assert [t.spoken for t in back] == [t.spoken for t in trajectories]
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.jsonl"]
    hx.write_trajectories(path, trajectories[:1])  # overwrite
    assert len(hx.read_trajectories(path)) == 1


def test_failed_write_leaves_the_old_file(trajectories, tmp_path):
    path = tmp_path / "t.jsonl"
    hx.write_trajectories(path, trajectories)
    before = path.read_text()

    def broken():
        yield trajectories[0]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        hx.write_trajectories(path, broken())
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_reading_bad_lines_names_the_line(tmp_path, trajectories):
    path = tmp_path / "t.jsonl"
    hx.write_trajectories(path, trajectories[:1])
    with open(path, "a") as f:
        f.write('{"schema_version": 99}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: .*schema_version 99"):
        hx.read_trajectories(path)
