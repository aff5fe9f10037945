"""`launch.rl` as a user runs it (the demo config, a few updates on the real Harness), and
each bad input refused by name: a scenario file or Harness that fails validation, a run
directory holding another architecture's checkpoints, a judge endpoint that is down."""

import json
import pathlib
import shutil

import httpx
import jax
import pytest

import data
from configs import rl_demo
from hat_jax import harness as hx
from hat_jax import llm_client, sharding
from hat_jax.checkpoint import CheckpointMismatchError
from launch import rl as rl_launch
from rl import rewards, sim

ONE_DEVICE = dict(devices=jax.devices()[:1])  # see tests/train/test_launch_sft.py


def _config(**trainer):
    c = rl_demo.get_config("hsa")
    c.policy.update(dict(kind="random", path=""))
    c.rollout.update(dict(scenarios=1, group_size=2, max_tokens=8))
    c.sim.update(dict(max_rounds=2))
    c.eval.update(dict(scenarios=1, trajectories=1))
    c.trainer.update(dict(total_steps=1, batch_size=4, seq_len=4608, eval_every=0,
                          checkpoint_every=1, progress=False, plots=False) | trainer)  # fmt: skip
    return c


@pytest.mark.slow
def test_rl_through_the_launch_script(tmp_path):
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    result = rl_launch.run(_config(), run_dir=str(tmp_path / "run"), mesh=mesh)
    assert result.step == 1 and result.before and result.after
    assert any("held-out reward" in line for line in rl_launch.summary(result))
    assert (tmp_path / "run" / "rl_summary.md").is_file()
    assert (tmp_path / "run" / "trajectories" / "step_1.md").is_file()
    metadata = json.loads((tmp_path / "run" / "rl_run.json").read_text())
    assert metadata["limits"]["budget_s"] == 1e6 and metadata["rewarder"] == "Rewarder"
    # A run directory with another architecture's checkpoints is refused, never overwritten.
    other = _config()
    other.model.update(dict(preset="tiny"))
    other.model.vocab_size = 4096
    with pytest.raises(CheckpointMismatchError):
        rl_launch.run(other, run_dir=str(tmp_path / "run"), mesh=mesh)


def test_a_scenario_file_that_fails_validation_is_named(tmp_path):
    bad = tmp_path / "scenarios.jsonl"
    bad.write_text('{"id": "s1"}\n')
    c = _config()
    c.sim.scenarios = str(bad)
    with pytest.raises(ValueError, match="scenarios.jsonl"):
        rl_launch.rooms(c, rl_launch.build(c).rl)


def test_a_harness_that_fails_validation_is_named(tmp_path):
    world = tmp_path / "world"
    shutil.copytree(pathlib.Path(data.__file__).parent / "livestream", world)
    tools = world / "harness" / "tools.json"
    spec = json.loads(tools.read_text())
    spec["tools"][0]["category"] = "teleportation"
    tools.write_text(json.dumps(spec))
    c = _config()
    c.sim.world = str(world)
    with pytest.raises(hx.HarnessError, match="tools.json"):
        rl_launch.rooms(c, rl_launch.build(c).rl)


def _down(request):
    raise httpx.ConnectError("connection refused", request=request)


def test_a_judge_that_is_down_fails_the_step_or_falls_back_to_the_rules_never_zero():
    room = sim.LiveRoom()
    episode = room.run(room.teacher(), seed=3)
    panel = rewards.JudgePanel([rewards.JudgeEndpoint(base_url="http://127.0.0.1:9", model=m)
                                for m in ("a", "b", "c")],
                               retry=llm_client.RetryPolicy(attempts=2, sleep=lambda s: None),
                               transport=httpx.MockTransport(_down))  # fmt: skip
    rules = rewards.Rewarder()
    strict = rewards.JudgedRewarder(rules, panel, on_failure="fail")
    with pytest.raises(rewards.JudgeUnavailable, match="no valid judge vote.*a: no answer"):
        strict.score(episode.scenario, episode.trajectory, episode.state)
    lenient = rewards.JudgedRewarder(rules, panel, on_failure="rules")
    scored = lenient.score(episode.scenario, episode.trajectory, episode.state)
    assert scored == rules.score(episode.scenario, episode.trajectory, episode.state)
    assert scored.accuracy == 1.0 and lenient.fallbacks == 1
    assert panel.stats.to_dict() == {"calls": 6, "retries": 6, "failures": 6}
    with pytest.raises(ValueError, match="on_failure='zero'"):
        rewards.JudgedRewarder(rules, panel, on_failure="zero")


def test_speculative_rollouts_need_a_draft_head(tmp_path):
    c = _config()
    c.rollout.num_draft_tokens = 3
    with pytest.raises(ValueError, match="set config.rollout.draft_head"):
        rl_launch.run(c, run_dir=str(tmp_path / "run"))
    c.rollout.draft_head = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.rollout.draft_head: .*nowhere"):
        rl_launch.run(c, run_dir=str(tmp_path / "run"))
    c.rollout.num_draft_tokens = -1
    with pytest.raises(ValueError, match="'num_draft_tokens': -1"):
        rl_launch.build(c)
