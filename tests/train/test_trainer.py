"""The trainer loop through `run_sft`: resume equality, unreadable checkpoints, preemption,
the non-finite stop, evaluation and the files a run leaves."""

import json
import os
import signal

import jax
import numpy as np
import pytest
from flax import nnx

from hat_jax.checkpoint import CheckpointManager, restore_params
from hat_jax.metrics import read_metrics
from hat_jax.sharding import MeshConfig
from hat_jax.train import (
    NonFiniteError,
    OptimizerConfig,
    SFTConfig,
    SyntheticTokenSource,
    TrainerConfig,
    run_sft,
    sft_driver,
    shared_state,
)
from tests.train.toy_model import LinearLM

VOCAB, BATCH, SEQ, STEPS = 32, 8, 16, 12


def _model_fn():
    return LinearLM(VOCAB, rngs=nnx.Rngs(0))


def _config(**trainer):
    base = dict(
        total_steps=STEPS,
        batch_size=BATCH,
        seq_len=SEQ,
        log_every=1,
        checkpoint_every=3,
        keep_checkpoints=5,
        progress=False,
        plots=False,
    )
    return SFTConfig(
        trainer=TrainerConfig(**(base | trainer)),
        optimizer=OptimizerConfig(learning_rate=0.05, warmup_steps=2, decay_steps=STEPS),
        mesh=MeshConfig(fsdp=2, tensor=2, data=2),
    )


def _source(seed=0):
    return SyntheticTokenSource(batch_size=BATCH, seq_len=SEQ, vocab_size=VOCAB, seed=seed)


class _Crash(Exception):
    pass


class _CrashingSource(SyntheticTokenSource):
    """Dies when asked for batch number `at` (0-based), like a process killed mid-run."""

    def __init__(self, at, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def __next__(self):
        if self._next == self.at:
            raise _Crash(f"killed before batch {self.at}")
        return super().__next__()


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def _final_params(run_dir):
    params, _ = restore_params(run_dir / "checkpoints")
    return jax.tree.leaves(params)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    result = run_sft(
        _config(plots=True),
        model_fn=_model_fn,
        data=_source(),
        run_dir=run_dir,
        model_config={"vocab": VOCAB},
    )
    return run_dir, result


def test_a_run_leaves_metrics_plots_and_checkpoints(uninterrupted):
    run_dir, result = uninterrupted
    assert result.step == STEPS and result.resumed_from is None and not result.preempted
    assert sorted(_losses(run_dir)) == list(range(1, STEPS + 1))
    assert (run_dir / "plots" / "loss.png").is_file() and (
        run_dir / "plots" / "overview.png"
    ).is_file()
    assert any((run_dir / "tensorboard").iterdir())
    assert CheckpointManager(run_dir / "checkpoints").steps() == [3, 6, 9, 12]
    assert result.checkpoint_dir == run_dir / "checkpoints" / "12"
    _, model_config = restore_params(result.checkpoint_dir)
    assert model_config == {"vocab": VOCAB}
    losses = _losses(run_dir)
    assert losses[STEPS] < losses[1], "training should reduce the loss on learnable data"


def test_rerunning_a_finished_run_changes_nothing(tmp_path):
    first = run_sft(_config(total_steps=3), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    again = run_sft(_config(total_steps=3), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    assert (again.resumed_from, again.step, again.checkpoint_dir) == (3, 3, first.checkpoint_dir)
    assert CheckpointManager(tmp_path / "checkpoints").steps() == [3]
    assert sorted(_losses(tmp_path)) == [1, 2, 3]


def test_a_checkpoint_of_another_process_count_is_refused_by_a_source_that_cannot_resplit(
    tmp_path,
):
    """Data states of 2 processes (as a 2-process run writes them) reach the trainer as
    `ProcessStates`; the synthetic source cannot re-split them, so the run stops, naming both
    counts, and the checkpoint is left in place."""
    from hat_jax.checkpoint import CheckpointError, ProcessStates

    run_sft(_config(total_steps=3), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    data_dir = tmp_path / "checkpoints" / "3" / "data"
    one = data_dir / "process_0-of-1.json"
    for i in range(2):
        (data_dir / f"process_{i}-of-2.json").write_text(one.read_text())
    one.unlink()
    restored = CheckpointManager(tmp_path / "checkpoints").restore(
        sft_driver(_config(), model_fn=_model_fn, run_dir=tmp_path / "x").abstract
    )
    assert isinstance(restored.data_state, ProcessStates) and restored.data_state.count == 2
    with pytest.raises(CheckpointError, match="written by 2 processes and this run has 1.*"
                       "SyntheticTokenSource cannot re-split"):  # fmt: skip
        run_sft(_config(total_steps=6), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    assert CheckpointManager(tmp_path / "checkpoints").steps() == [3]
    (data_dir / "process_1-of-2.json").unlink()
    with pytest.raises(CheckpointError, match="no complete set"):
        CheckpointManager(tmp_path / "checkpoints").restore(
            sft_driver(_config(), model_fn=_model_fn, run_dir=tmp_path / "x").abstract, step=3
        )


@pytest.mark.parametrize("kill_at", [7, 9])
def test_kill_and_resume_reproduces_the_uninterrupted_losses(uninterrupted, tmp_path, kill_at):
    straight_dir, _ = uninterrupted
    with pytest.raises(_Crash):
        run_sft(
            _config(),
            model_fn=_model_fn,
            run_dir=tmp_path,
            data=_CrashingSource(kill_at, batch_size=BATCH, seq_len=SEQ, vocab_size=VOCAB),
        )
    result = run_sft(_config(), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    assert result.resumed_from == (kill_at // 3) * 3
    assert _losses(tmp_path) == _losses(straight_dir), "bitwise-equal losses after resuming"
    for a, b in zip(_final_params(tmp_path), _final_params(straight_dir), strict=True):
        np.testing.assert_array_equal(a, b)


def test_unreadable_latest_checkpoint_is_reported_and_the_previous_used(
    uninterrupted, tmp_path, caplog
):
    straight_dir, _ = uninterrupted
    with pytest.raises(_Crash):
        run_sft(
            _config(),
            model_fn=_model_fn,
            run_dir=tmp_path,
            data=_CrashingSource(8, batch_size=BATCH, seq_len=SEQ, vocab_size=VOCAB),
        )
    damaged = tmp_path / "checkpoints" / "6" / "train_state"
    for path in damaged.rglob("*"):
        if path.is_file() and path.name != "commit_success.txt":
            path.write_bytes(b"\x00garbage")
    result = run_sft(_config(), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    assert result.resumed_from == 3
    assert "checkpoint step 6 is unreadable" in caplog.text
    assert any(p.name.startswith("unreadable-6-") for p in (tmp_path / "checkpoints").iterdir())
    assert _losses(tmp_path) == _losses(straight_dir)


def test_sigterm_saves_and_stops_then_resumes(uninterrupted, tmp_path):
    straight_dir, _ = uninterrupted

    class _Terminating(SyntheticTokenSource):
        def __next__(self):
            if self._next == 4:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().__next__()

    first = run_sft(
        _config(),
        model_fn=_model_fn,
        run_dir=tmp_path,
        data=_Terminating(batch_size=BATCH, seq_len=SEQ, vocab_size=VOCAB),
    )
    assert first.preempted and first.step == 5
    assert CheckpointManager(tmp_path / "checkpoints").latest_step() == 5
    again = run_sft(_config(), model_fn=_model_fn, data=_source(), run_dir=tmp_path)
    assert again.resumed_from == 5 and again.step == STEPS
    assert _losses(tmp_path) == _losses(straight_dir)


def test_consecutive_non_finite_steps_stop_the_run_with_a_clear_message(tmp_path):
    class _Broken(nnx.Module):
        def __init__(self):
            self.inner = _model_fn()

        def __call__(self, input_ids, **kwargs):
            out = self.inner(input_ids, **kwargs)
            return out.replace(logits=out.logits * np.nan)

    config = _config(max_nonfinite_steps=3, checkpoint_every=0)
    with pytest.raises(NonFiniteError, match="3 consecutive steps had a non-finite loss"):
        run_sft(config, model_fn=_Broken, data=_source(), run_dir=tmp_path)
    records = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert records and all(r["loss"] is None and r["skipped"] == 1 for r in records)


def test_evaluation_hook_logs_token_weighted_eval_metrics(tmp_path):
    config = _config(total_steps=4, eval_every=2, eval_batches=2, checkpoint_every=0)
    run_sft(
        config,
        model_fn=_model_fn,
        data=_source(),
        run_dir=tmp_path,
        eval_data=lambda: _source(seed=7),
    )
    evals = [r for r in read_metrics(tmp_path) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert evals[0]["eval/weight"] > 0 and evals[1]["eval/loss"] < evals[0]["eval/loss"]
    data_state = json.loads(
        (tmp_path / "checkpoints" / "4" / "data" / "process_0-of-1.json").read_text()
    )
    assert data_state["state"] == {"next_batch": 4, "seed": 0}


def test_shared_state_takes_the_one_position_every_process_saved():
    own = {"rollouts": 3, "seed": 0}
    assert shared_state(own, "RLSource") is own
    assert shared_state([own, dict(own)], "RLSource") == own
    with pytest.raises(ValueError, match="RLSource: the processes' saved positions differ"):
        shared_state([own, {"rollouts": 2, "seed": 0}], "RLSource")


def test_a_run_killed_in_an_evaluation_resumes_with_that_evaluation(tmp_path):
    """Evaluation runs before the checkpoint of its step: a run that dies inside it resumes
    from the checkpoint before, so no step's evaluation goes missing."""
    calls = []

    def probe(model, crash_at=None):
        calls.append(None)
        if len(calls) == crash_at:
            raise _Crash("killed inside the evaluation")
        return {"probe": float(np.asarray(model.embed_tokens.embedding[...]).sum())}

    config = _config(total_steps=9, eval_every=3, checkpoint_every=3)

    def run(name, evaluation):
        return run_sft(config, run_dir=tmp_path / name, model_fn=_model_fn, data=_source(),
                       eval_data=lambda: _source(seed=7), model_evaluations=[evaluation])  # fmt: skip

    run("straight", probe)
    calls.clear()
    with pytest.raises(_Crash):
        run("killed", lambda model: probe(model, crash_at=2))  # dies evaluating step 6
    result = run("killed", probe)
    assert result.resumed_from == 3
    clocks = ("time", "seconds", "per_second")
    a, b = ([{k: v for k, v in r.items() if not k.endswith(clocks)} for r in read_metrics(d)]
            for d in (tmp_path / "straight", tmp_path / "killed"))  # fmt: skip
    assert [r["step"] for r in b if "eval/probe" in r] == [3, 6, 9]
    assert a == b
