"""Resume proven by process kill, stage by stage: each stage's launch command, on a tiny
config, killed (SIGKILL) after a checkpoint is committed and records past it are logged, then
run again; its metrics file (every figure but the clocks) and its final parameters equal an
uninterrupted run's exactly (CPU). The shared machinery is `tests/_kill.py`."""

import subprocess
import sys

import pytest

from hat_jax import livestream
from tests import _kill


def _past_checkpoint(checkpoint: int, logged: int):
    """Kill once `checkpoint` is committed and the record of step `logged` is written."""

    def ready(run_dir):
        return checkpoint in _kill.committed_steps(run_dir) and logged in _kill.logged_steps(
            run_dir
        )

    return ready


@pytest.mark.slow
def test_sft_killed_after_a_checkpoint_resumes_to_the_same_run(tmp_path):
    corpus = tmp_path / "corpus"
    cmd = [sys.executable, "-m", "launch.make_corpus", "--out", str(corpus), "--num_scenarios",
           "2", "--states_per_scenario", "2", "--splits", "train", "--room", "micro"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=_kill.REPO, timeout=600)
    # HSA-SFT with online HSA (its random draws are part of the resumed state) in the micro
    # room (rows of its token budget); 4 steps, checkpoints at 2 and 4, killed inside step 4
    # (step 3 logged past checkpoint 2).
    overrides = dict(data__corpus=corpus, data__eval_split="", model__preset="micro",
                     trainer__total_steps=4, trainer__batch_size=1,
                     trainer__seq_len=livestream.room("micro").token_budget, trainer__log_every=1,
                     trainer__checkpoint_every=2, trainer__progress=False,
                     trainer__plots=False)  # fmt: skip
    straight, killed, at_kill, resumed = _kill.kill_and_resume(
        tmp_path,
        lambda run_dir: _kill.command("sft", "configs/sft_demo.py", run_dir, **overrides),
        _past_checkpoint(2, 3),
    )
    assert "resumed from step 2" in resumed
    records = _kill.assert_same_metrics(straight, killed)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    _kill.assert_same_params(straight, killed)


@pytest.mark.slow
def test_mtp_killed_after_a_checkpoint_resumes_to_the_same_run(tmp_path):
    # A random policy's rollouts of 2 prompts, one row per step (the pool cycles, so
    # checkpoints fall inside its epochs), 40 steps of milliseconds with a checkpoint and a
    # held-out evaluation every 5: killed as soon as a checkpoint is committed and a later
    # step logged, somewhere in steps 5-35.
    overrides = dict(data__heldout_instructions=4, data__max_prompt_len=96,
                     rollout__batch_size=2, rollout__batches=1, rollout__eval_batches=1,
                     rollout__max_new_tokens=8, trainer__total_steps=40, trainer__batch_size=1,
                     trainer__seq_len=104, trainer__log_every=1, trainer__eval_every=5,
                     trainer__checkpoint_every=5, trainer__progress=False,
                     trainer__plots=False, measure_speculative=False,
                     export__hf_dir="")  # fmt: skip
    straight, killed, at_kill, _ = _kill.kill_and_resume(
        tmp_path,
        lambda run_dir: _kill.command("mtp", "configs/mtp_demo.py:random", run_dir, **overrides),
        _kill.past_a_checkpoint,
    )
    assert at_kill.committed and at_kill.committed[-1] < 40, at_kill
    records = _kill.assert_same_metrics(straight, killed)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 41))
    assert [r["step"] for r in records if "eval/loss" in r] == list(range(5, 41, 5))
    _kill.assert_same_params(straight, killed)


@pytest.mark.slow
def test_opd_killed_after_a_checkpoint_resumes_to_the_same_run(tmp_path):
    # A random student toward a random teacher on the bundled prompts, 12 steps (each samples
    # its own rows with the current weights), a checkpoint every 2 and the held-out
    # evaluation every 3: killed once a checkpoint is committed and a later step logged.
    overrides = dict(data__heldout_instructions=4, data__max_prompt_len=44,
                     sampling__max_new_tokens=8, eval__samples=1, trainer__total_steps=12,
                     trainer__batch_size=4, trainer__seq_len=52, trainer__log_every=1,
                     trainer__eval_every=3, trainer__checkpoint_every=2,
                     trainer__progress=False, trainer__plots=False)  # fmt: skip
    straight, killed, at_kill, _ = _kill.kill_and_resume(
        tmp_path,
        lambda run_dir: _kill.command("opd", "configs/opd_demo.py:random", run_dir, **overrides),
        _kill.past_a_checkpoint,
    )
    assert at_kill.committed and at_kill.committed[-1] < 12, at_kill
    records = _kill.assert_same_metrics(straight, killed)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 13))
    assert [r["step"] for r in records if len(r) > 1 and "loss" not in r] == [0, 3, 6, 9, 12]
    _kill.assert_same_params(straight, killed)


@pytest.mark.slow
def test_rl_killed_inside_a_rollout_resumes_to_the_same_run(tmp_path):
    # HSA-RL of a random micro policy in the micro live room: one scenario's group of 2
    # episodes per rollout, 2 updates of 4 rows each per rollout, a checkpoint every update
    # (so every other one falls inside a rollout). Killed as soon as a checkpoint is
    # committed: right after update 1 (the resumed run trains on that rollout's saved rows)
    # or while the second rollout is being sampled.
    overrides = dict(policy__kind="random", policy__path="", model__preset="micro",
                     sim__room="micro", sim__max_rounds=2, rollout__scenarios=1,
                     rollout__group_size=2, rollout__max_tokens=8, eval__scenarios=1,
                     eval__trajectories=1, trainer__total_steps=4, trainer__batch_size=4,
                     trainer__seq_len=2048, trainer__log_every=1, trainer__eval_every=0,
                     trainer__checkpoint_every=1, trainer__progress=False,
                     trainer__plots=False)  # fmt: skip
    straight, killed, at_kill, _ = _kill.kill_and_resume(
        tmp_path,
        lambda run_dir: _kill.command("rl", "configs/rl_demo.py:hsa", run_dir, **overrides),
        lambda run_dir: bool(_kill.committed_steps(run_dir)),
    )
    assert at_kill.committed and at_kill.committed[-1] < 4, at_kill
    records = _kill.assert_same_metrics(straight, killed)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    _kill.assert_same_params(straight, killed)
