"""HSA-RL: the same seed gives the same run, and a run killed inside a rollout and resumed
repeats the uninterrupted run's metrics."""

import pytest

from hat_jax.checkpoint import CheckpointManager
from hat_jax.metrics import read_metrics
from tests.rl import rl_check


def _metrics(run_dir):
    timing = ("time", "seconds", "per_second", "data_seconds", "learn_seconds")
    return [{k: v for k, v in r.items() if not any(t in k for t in timing)}
            for r in read_metrics(run_dir)]  # fmt: skip


@pytest.mark.slow
def test_two_runs_agree_and_kill_and_resume_repeats_the_losses(tmp_path):
    config = rl_check.stage_config(steps=6, batch_size=8, checkpoint_every=3, eval_every=0)
    rl_check.run(tmp_path / "a", config=config)
    # Rollouts of ~20 rows, 8 rows per update: checkpoint 3 falls inside a rollout, and the
    # resumed run trains on that rollout's saved rows.
    with pytest.raises(KeyboardInterrupt):
        rl_check.run(tmp_path / "b", config=config, fail_at=2)
    assert CheckpointManager(tmp_path / "b" / "checkpoints").latest_step() == 3
    result = rl_check.run(tmp_path / "b", config=config)
    assert result.resumed_from == 3
    # The same seed gives the same run: every figure but the clocks, the killed-and-resumed
    # run's too (its records past the checkpoint were dropped and written again).
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")
    assert rl_check.step_losses(tmp_path / "b") == rl_check.step_losses(tmp_path / "a")
