"""The train step: sharding invariance, exact accumulation, the non-finite guard, the loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hat_jax import sharding
from hat_jax.train import (
    LossOutput,
    SyntheticTokenSource,
    abstract_split,
    abstract_train_state,
    batch_shardings_for,
    init_train_state,
    make_train_step,
    next_token_targets,
    sft_loss,
)
from tests.train.toy_model import LinearLM, ToyConfig, ToyLM

CONFIG = ToyConfig()
BATCH, SEQ = 8, 32


def _model_fn():
    return ToyLM(CONFIG, seed=0)


def _linear_fn():
    return LinearLM(CONFIG.vocab, rngs=nnx.Rngs(0))


def _batch(seed=0):
    return next(
        SyntheticTokenSource(batch_size=BATCH, seq_len=SEQ, vocab_size=CONFIG.vocab, seed=seed)
    )


def _keep_gradient():
    """An "optimiser" that leaves parameters alone and keeps the last gradient as its state."""
    return optax.GradientTransformation(
        init=lambda params: jax.tree.map(jnp.zeros_like, params),
        update=lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
    )


def _grad_step(mesh_config, devices, *, micro_batches=1, loss_fn=None, aux=0.0):
    """One step; returns (metrics, params, gradient, state) with numpy trees."""
    mesh = sharding.make_mesh(mesh_config, devices=devices)
    graphdef, abs_params, abs_rest = abstract_split(_model_fn, mesh)
    optimizer = _keep_gradient()
    abstract = abstract_train_state(abs_params, abs_rest, optimizer, mesh)
    model = sharding.init_sharded(_model_fn, mesh)
    _, state = init_train_state(model, optimizer, mesh, seed=0)
    step = make_train_step(
        loss_fn or functools.partial(sft_loss, aux_loss_coef=aux),
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=sharding.shardings_of(abstract),
        batch_shardings=batch_shardings_for(mesh),
        micro_batches=micro_batches,
        donate=False,
    )
    new_state, metrics = step(state, sharding.global_batch(_batch(), mesh))
    params = jax.device_get(nnx.to_pure_dict(state.params))
    grads = jax.device_get(nnx.to_pure_dict(new_state.opt_state))
    return jax.device_get(metrics), params, grads, new_state


@pytest.fixture(scope="module")
def reference():
    return _grad_step(sharding.MeshConfig(fsdp=1), jax.devices()[:1])


LAYOUTS = {
    "8x1 (fsdp 8)": sharding.MeshConfig(fsdp=8, tensor=1),
    "2x4 (fsdp 2, tensor 4)": sharding.MeshConfig(fsdp=2, tensor=4),
    "experts sharded (expert 4, fsdp 2)": sharding.MeshConfig(fsdp=2, expert=4),
    "data 2, fsdp 2, tensor 2": sharding.MeshConfig(data=2, fsdp=2, tensor=2),
}
SLOW_LAYOUTS = {"data 2, fsdp 2, tensor 2"}


@pytest.mark.parametrize(
    "layout",
    [pytest.param(k, marks=[pytest.mark.slow] if k in SLOW_LAYOUTS else []) for k in LAYOUTS],
)
def test_same_loss_and_gradients_on_one_and_eight_devices(reference, layout):
    ref_metrics, ref_params, ref_grads, _ = reference
    metrics, params, grads, state = _grad_step(LAYOUTS[layout], jax.devices())
    sharded = [x for x in jax.tree.leaves(state.params) if not x.sharding.is_fully_replicated]
    assert sharded, "the layout should actually shard some parameters"
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-6)
    np.testing.assert_allclose(metrics["aux_loss"], ref_metrics["aux_loss"], rtol=1e-6)
    assert metrics["weight"] == ref_metrics["weight"]
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7),
        grads,
        ref_grads,
    )


def test_four_micro_batches_equal_one_large_batch(reference):
    ref_metrics, _, ref_grads, _ = reference
    mesh = sharding.MeshConfig(fsdp=2, tensor=2, expert=2)
    metrics, _, grads, _ = _grad_step(mesh, jax.devices(), micro_batches=4)
    np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-6)
    np.testing.assert_allclose(metrics["ce"], ref_metrics["ce"], rtol=1e-6)
    assert metrics["weight"] == ref_metrics["weight"]
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), grads, ref_grads
    )
    # The MoE aux loss is a per-micro-batch statistic: reported token-weighted over them.
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}
    per_micro = nnx.jit(lambda m, b: sft_loss(m, b, None))
    model = _model_fn()
    outs = [per_micro(model, {key: v[k::4] for key, v in batch.items()}) for k in range(4)]
    weighted = sum(float(o.metrics["aux_loss"]) for o in outs) / sum(float(o.weight) for o in outs)
    np.testing.assert_allclose(metrics["aux_loss"], weighted, rtol=1e-6)


def _poisoned(model, batch, rng):
    out = sft_loss(model, batch, rng)
    bad = jnp.any(batch["input_ids"] < 0)
    return out._replace(total=jnp.where(bad, jnp.nan, out.total))


def test_non_finite_guard_skips_the_update_and_counts():
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=8))
    graphdef, abs_params, abs_rest = abstract_split(_linear_fn, mesh)
    optimizer = optax.adam(1e-2)
    abstract = abstract_train_state(abs_params, abs_rest, optimizer, mesh)
    _, state = init_train_state(sharding.init_sharded(_linear_fn, mesh), optimizer, mesh, seed=0)
    step = make_train_step(
        _poisoned,
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=sharding.shardings_of(abstract),
        batch_shardings=batch_shardings_for(mesh),
        donate=False,
    )
    good = _batch()
    bad = dict(
        good, input_ids=np.where(np.arange(SEQ) == 3, -1, good["input_ids"]).astype(np.int32)
    )
    history = []
    for batch in (good, bad, bad, good, bad):
        before = jax.device_get(state)
        state, metrics = step(state, sharding.global_batch(batch, mesh))
        after = jax.device_get(state)
        changed = not all(
            np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(before.params), jax.tree.leaves(after.params))
        )
        opt_same = all(
            np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(before.opt_state), jax.tree.leaves(after.opt_state))
        )
        history.append(
            (int(metrics["skipped"]), int(metrics["nonfinite_streak"]), changed, opt_same)
        )
    assert history == [
        (0, 0, True, False),
        (1, 1, False, True),
        (1, 2, False, True),
        (0, 0, True, False),
        (1, 1, False, True),
    ]
    assert int(state.step) == 5 and int(state.nonfinite_total) == 3


def test_next_token_targets_respect_segments_padding_and_mask():
    batch = {
        "input_ids": jnp.array([[5, 6, 7, 8, 9, 1, 2, 0]]),
        "loss_mask": jnp.array([[0, 1, 1, 0, 1, 1, 1, 0]]),
        "segment_ids": jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]),
        "positions": jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
    }
    targets, weights = next_token_targets(batch)
    np.testing.assert_array_equal(targets, [[6, 7, 8, 9, 1, 2, 0]])
    # 6, 7 learnt; 8 starts segment 2 (no target across the boundary); 9, 1, 2 learnt; pad not.
    np.testing.assert_array_equal(weights, [[1, 1, 0, 1, 1, 1, 0]])


class _FixedLogits(nnx.Module):
    def __init__(self, logits, aux):
        self.logits, self.aux = logits, aux

    def __call__(self, ids, *, positions, segment_ids):
        return type("Out", (), {"logits": self.logits, "aux_loss": self.aux})()


def test_sft_loss_by_hand():
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]))
    batch = {
        "input_ids": jnp.array([[0, 0, 2]]),
        "loss_mask": jnp.array([[0, 1, 1]]),
        "segment_ids": jnp.array([[1, 1, 1]]),
        "positions": jnp.array([[0, 1, 2]]),
    }
    out = sft_loss(_FixedLogits(logits, jnp.float32(0.3)), batch, None, aux_loss_coef=2.0)
    # targets: position 0 -> token 0 (p=0.5), position 1 -> token 2 (p=0.8)
    ce = -np.log(0.5) - np.log(0.8)
    assert isinstance(out, LossOutput)
    np.testing.assert_allclose(out.weight, 2.0)
    np.testing.assert_allclose(out.metrics["ce"], ce, rtol=1e-6)
    np.testing.assert_allclose(out.total, ce + 2.0 * 0.3 * 2, rtol=1e-6)
    np.testing.assert_allclose(out.metrics["accuracy"], 2.0)


def test_chunked_cross_entropy_equals_the_full_logits_loss():
    model = _model_fn()
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}

    def loss(model, chunk):
        out = sft_loss(model, batch, None, aux_loss_coef=0.1, logits_chunk=chunk)
        return out.total / out.weight, out

    full = nnx.jit(nnx.value_and_grad(functools.partial(loss, chunk=0), has_aux=True))
    chunked = nnx.jit(nnx.value_and_grad(functools.partial(loss, chunk=7), has_aux=True))
    (a, out_a), grads_a = full(model)
    (b, out_b), grads_b = chunked(model)  # 31 positions in chunks of 7: padding included
    np.testing.assert_allclose(b, a, rtol=1e-6)
    np.testing.assert_allclose(out_b.metrics["accuracy"], out_a.metrics["accuracy"])
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7),
        nnx.to_pure_dict(grads_b),
        nnx.to_pure_dict(grads_a),
    )


def test_low_precision_parameters_and_moments_keep_their_dtype():
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=8))
    model_fn = lambda: LinearLM(CONFIG.vocab, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)  # noqa: E731
    graphdef, abs_params, abs_rest = abstract_split(model_fn, mesh)
    optimizer = optax.adamw(1e-2)
    abstract = abstract_train_state(abs_params, abs_rest, optimizer, mesh)
    _, state = init_train_state(sharding.init_sharded(model_fn, mesh), optimizer, mesh, seed=0)
    step = make_train_step(
        sft_loss,
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=sharding.shardings_of(abstract),
        batch_shardings=batch_shardings_for(mesh),
        micro_batches=2,
    )
    new, metrics = step(state, sharding.global_batch(_batch(), mesh))
    dtypes = lambda s: [x.dtype for x in jax.tree.leaves((s.params, s.opt_state))]  # noqa: E731
    assert dtypes(new) == dtypes(abstract) and jnp.bfloat16 in dtypes(new)
    assert np.isfinite(metrics["loss"]) and int(metrics["skipped"]) == 0
