"""The stage driver: frozen models (read from their source, never trained or checkpointed),
the checkpoint root, a trainable subset, on-policy sources (current weights, exact resume),
evaluations at the last step, and clear errors for a malformed stage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hat_jax import sharding, train
from hat_jax.checkpoint import restore_params
from hat_jax.metrics import read_metrics
from tests.train.toy_model import ToyConfig, ToyLM

CONFIG = ToyConfig(layers=1)
BATCH, SEQ = 4, 16


def _stage_config(**trainer):
    base = dict(total_steps=4, batch_size=BATCH, seq_len=SEQ, log_every=1, checkpoint_every=2,
                keep_checkpoints=4, progress=False, plots=False, async_checkpoints=False)  # fmt: skip
    return train.StageConfig(
        trainer=train.TrainerConfig(**(base | trainer)),
        optimizer=train.OptimizerConfig(learning_rate=0.02, warmup_steps=0, decay_steps=10),
        mesh=sharding.MeshConfig(fsdp=2, data=2, tensor=2),
    )


def _source(seed=0):
    return train.SyntheticTokenSource(batch_size=BATCH, seq_len=SEQ, vocab_size=CONFIG.vocab,
                                      seed=seed)  # fmt: skip


def _distil(model, batch, rng):
    """Cross-entropy of the policy plus a pull toward a (frozen) teacher's logits."""
    out = train.sft_loss(model.policy, batch, rng)
    student = model.policy(batch["input_ids"]).logits
    teacher = model.teacher(batch["input_ids"]).logits
    pull = jnp.sum(jnp.mean((student - teacher) ** 2, -1) * (batch["segment_ids"] > 0))
    return out._replace(total=out.total + 0.1 * pull)


def _teacher_init(abstract):
    return nnx.state(ToyLM(CONFIG, seed=7), nnx.Param)


def _driver(run_dir, **kwargs):
    models = {
        "policy": train.ModelSpec(build=lambda: ToyLM(CONFIG, seed=0)),
        "teacher": train.ModelSpec(build=lambda: ToyLM(CONFIG, seed=0), init=_teacher_init,
                                   frozen=True),
    }  # fmt: skip
    return train.StageDriver(_stage_config(**kwargs), models=models, loss_fn=_distil,
                             run_dir=run_dir, checkpoint_root="policy")  # fmt: skip


def _single(run_dir, trainable=nnx.Param, **trainer):
    """A one-model stage (the toy policy, SFT loss)."""
    return train.StageDriver(
        _stage_config(**trainer), models=train.ModelSpec(build=lambda: ToyLM(CONFIG, seed=0)),
        loss_fn=train.sft_loss, run_dir=run_dir, trainable=trainable,
    )  # fmt: skip


def _flat(state):
    return {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def test_a_frozen_model_is_read_from_its_source_and_never_trained_or_written(tmp_path):
    driver = _driver(tmp_path)
    result = driver.run(_source())
    teacher = _flat(nnx.state(driver.model(result.state).teacher, nnx.Param))
    source = _flat(_teacher_init(None))
    assert teacher.keys() == source.keys()
    for k in source:
        np.testing.assert_array_equal(teacher[k], source[k])
    policy = _flat(nnx.state(driver.model(result.state).policy, nnx.Param))
    start = _flat(nnx.state(ToyLM(CONFIG, seed=0), nnx.Param))
    assert any(not np.array_equal(policy[k], start[k]) for k in start), "the policy trains"
    # The checkpoint holds the policy at its root (as a one-model stage writes it), no teacher.
    params, _ = restore_params(tmp_path / "checkpoints")
    assert set(params) == {k.split("/")[0] for k in start}  # no "teacher", no "policy" level
    assert not (tmp_path / "checkpoints" / "4" / "train_state" / "frozen").exists()


class _Crash(Exception):
    pass


class _Crashing(train.SyntheticTokenSource):
    def __init__(self, at, **kwargs):
        super().__init__(**kwargs)
        self.at = at

    def __next__(self):
        if self._next == self.at:
            raise _Crash()
        return super().__next__()


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def test_resuming_a_stage_with_a_frozen_model_repeats_the_losses(tmp_path):
    _driver(tmp_path / "straight").run(_source())
    with pytest.raises(_Crash):
        _driver(tmp_path / "killed").run(
            _Crashing(3, batch_size=BATCH, seq_len=SEQ, vocab_size=CONFIG.vocab)
        )
    result = _driver(tmp_path / "killed").run(_source())
    assert result.resumed_from == 2 and result.step == 4
    assert _losses(tmp_path / "killed") == _losses(tmp_path / "straight")


def test_a_trainable_subset_trains_alone_and_the_rest_is_checkpointed(tmp_path):
    only_q = nnx.All(nnx.Param, nnx.PathContains("wq"))
    driver = _single(tmp_path, trainable=only_q, total_steps=2)
    result = driver.run(_source())
    assert set(_flat(result.state.params)) == {"wq"}
    after = _flat(nnx.state(driver.model(result.state), nnx.Param))
    start = _flat(nnx.state(ToyLM(CONFIG, seed=0), nnx.Param))
    changed = {k for k in start if not np.array_equal(after[k], start[k])}
    assert changed == {"wq"}


class _OnPolicy:
    """Rows made from the current weights (a checksum of them becomes the batch's tokens), a
    counter and a numpy RNG as state: the shape of an OPD or RL sampler."""

    def __init__(self, seed=0):
        self.seed, self.calls, self.seen = seed, 0, []

    def next_batch(self, model):
        checksum = float(jnp.sum(model.wq[...]))
        self.seen.append(checksum)
        rng = np.random.default_rng([self.seed, self.calls])
        self.calls += 1
        batch = next(_source(seed=int(rng.integers(1000))))
        return batch, {"checksum": checksum}

    def get_state(self):
        return {"calls": self.calls}

    def set_state(self, state):
        self.calls = int(state["calls"])


def test_an_on_policy_source_samples_with_the_current_weights_and_resumes_exactly(tmp_path):
    def run(run_dir, source):
        return _single(run_dir).run(source)

    source = _OnPolicy()
    run(tmp_path / "a", source)
    start = float(jnp.sum(ToyLM(CONFIG, seed=0).wq[...]))
    assert source.seen[0] == pytest.approx(start, rel=1e-6)
    assert len(set(source.seen)) == 4, "each batch is made with the previous step's weights"
    records = [r for r in read_metrics(tmp_path / "a") if "loss" in r]
    assert all("checksum" in r and r["learn_seconds"] > 0 for r in records)

    class _Dies(_OnPolicy):
        def next_batch(self, model):
            if self.calls == 3:
                raise _Crash()
            return super().next_batch(model)

    with pytest.raises(_Crash):
        run(tmp_path / "b", _Dies())
    resumed = _OnPolicy()
    run(tmp_path / "b", resumed)
    assert resumed.seen == source.seen[2:]
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")


def test_evaluations_also_run_at_the_last_step(tmp_path):
    calls = []

    def evaluation(state):
        calls.append(int(jax.device_get(state.step)))
        return {"probe": 1.0}

    _single(tmp_path, total_steps=5, eval_every=2).run(_source(), [evaluation])
    assert calls == [2, 4, 5]
    steps = [r["step"] for r in read_metrics(tmp_path) if "eval/probe" in r]
    assert steps == [2, 4, 5]
    # Resuming the finished run evaluates nothing again.
    _single(tmp_path, total_steps=5, eval_every=2).run(_source(), [evaluation])
    assert calls == [2, 4, 5]


def test_a_malformed_stage_is_refused_with_a_clear_error(tmp_path):
    build = lambda: ToyLM(CONFIG, seed=0)  # noqa: E731
    with pytest.raises(ValueError, match="a function `abstract params -> params` or 'random'"):
        train.ModelSpec(build=build, init="orbax")
    with pytest.raises(ValueError, match="every model is frozen"):
        train.StageDriver(_stage_config(), models={"a": train.ModelSpec(build=build, frozen=True)},
                          loss_fn=train.sft_loss, run_dir=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match="selects no variable"):
        train.StageDriver(_stage_config(), models=train.ModelSpec(build=build),
                          trainable=nnx.PathContains("nothing"), loss_fn=train.sft_loss,
                          run_dir=tmp_path)  # fmt: skip
    driver = train.StageDriver(_stage_config(batch_size=6), models=train.ModelSpec(build=build),
                               loss_fn=train.sft_loss, run_dir=tmp_path)  # fmt: skip
    with pytest.raises(ValueError, match="not divisible by the data-parallel size 4"):
        driver.start(_source())
