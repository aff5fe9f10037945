"""The dropless MoE dispatches agree with each other (values and gradients), including
skewed routing (every token on the same experts), empty experts, ragged block fills and
experts over the "capacity" grid (their rows run by the overflow loop)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import (
    capacity_experts,
    dense_experts,
    expert_capacity,
    gathered_experts,
    ragged_experts,
    sorted_experts,
)

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 300, 16, 12, 8, 2


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(TOKENS, HIDDEN))
    gate_up = rng.normal(size=(EXPERTS, HIDDEN, 2, FFN)) * 0.3
    down = rng.normal(size=(EXPERTS, FFN, HIDDEN)) * 0.3
    return tuple(jnp.asarray(a, jnp.float32) for a in (x, gate_up, down))


def _routing(kind: str, seed=0):
    """(indices int[N, K], weights f32[N, K]) for a routing pattern."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        idx = np.argsort(rng.random((TOKENS, EXPERTS)), axis=1)[:, :TOP_K]
    elif kind == "skewed":  # every token on experts 3 and 5; the other six are empty
        idx = np.tile([3, 5], (TOKENS, 1))
    else:  # "sparse": only experts 0, 1, 7 are used, unevenly
        idx = np.stack([rng.choice([0, 1], TOKENS), np.full(TOKENS, 7)], 1)
    weights = rng.random((TOKENS, TOP_K))
    return jnp.asarray(idx, jnp.int32), jnp.asarray(weights / weights.sum(1, keepdims=True))


DISPATCHES = {
    "dense": dense_experts,
    "sorted_b16": functools.partial(sorted_experts, block_size=16),
    "sorted_b512": functools.partial(sorted_experts, block_size=512),
    "gathered_b16": functools.partial(gathered_experts, block_size=16),
    "gathered_b512": functools.partial(gathered_experts, block_size=512),
    "ragged": ragged_experts,
    # Factor 1.25: random routing fits, skewed/sparse overflow; 0.1: nearly all overflow.
    "capacity_1.25": functools.partial(capacity_experts, capacity_factor=1.25, block_size=16),
    "capacity_0.1_b64": functools.partial(capacity_experts, capacity_factor=0.1, block_size=64),
    "capacity_4": functools.partial(capacity_experts, capacity_factor=4.0, block_size=16),
}


@functools.partial(jax.jit, static_argnums=0)
def _value_and_grads(name_or_dispatch, x, idx, w, gate_up, down):
    dispatch = DISPATCHES.get(name_or_dispatch) or name_or_dispatch

    def loss(x, w, gate_up, down):
        y = dispatch(x, idx, w, gate_up, down)
        return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape))), y

    (_, y), grads = jax.value_and_grad(loss, argnums=range(4), has_aux=True)(x, w, gate_up, down)
    return y, grads


@pytest.mark.parametrize("routing", ["random", "skewed", "sparse"])
def test_dispatches_agree_with_the_dense_reference(routing):
    x, gate_up, down = _weights()
    idx, w = _routing(routing)
    ref_y, ref_grads = _value_and_grads("dense", x, idx, w, gate_up, down)
    for name in DISPATCHES:
        y, grads = _value_and_grads(name, x, idx, w, gate_up, down)
        np.testing.assert_allclose(y, ref_y, atol=1e-5, err_msg=f"{name} output")
        for i, (g, r) in enumerate(zip(grads, ref_grads)):
            np.testing.assert_allclose(g, r, atol=1e-4, err_msg=f"{name} grad {i}")


def test_dense_reference_is_the_weighted_sum_of_expert_mlps():
    x, gate_up, down = _weights()
    idx, w = _routing("random")
    y = np.asarray(dense_experts(x, idx, w, gate_up, down))
    x, gate_up, down, idx, w = map(np.asarray, (x, gate_up, down, idx, w))
    for n in (0, 17, 299):
        expect = 0
        for k in range(TOP_K):
            e = idx[n, k]
            h = x[n] @ gate_up[e, :, 0]
            up = x[n] @ gate_up[e, :, 1]
            expect = expect + w[n, k] * ((h / (1 + np.exp(-h))) * up) @ down[e]
        np.testing.assert_allclose(y[n], expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(DISPATCHES))
def test_expert_index_past_the_last_means_no_expert_here(name):
    """The expert-parallel contract: an assignment with expert index E (another device's
    expert) contributes nothing, and its routing weight gets no gradient."""
    x, gate_up, down = _weights()
    idx, w = _routing("random", seed=1)
    away = jnp.asarray(np.random.default_rng(2).random(idx.shape) < 0.4)
    marked = jnp.where(away, EXPERTS, idx)
    want_y, want_grads = _value_and_grads("dense", x, idx, jnp.where(away, 0.0, w), gate_up, down)
    y, grads = _value_and_grads(name, x, marked, w, gate_up, down)
    np.testing.assert_allclose(y, want_y, atol=1e-5)
    for i in (0, 2, 3):
        np.testing.assert_allclose(grads[i], want_grads[i], atol=1e-4, err_msg=f"grad {i}")
    np.testing.assert_allclose(grads[1], jnp.where(away, 0.0, want_grads[1]), atol=1e-4)


def test_expert_capacity_is_a_multiple_of_eight_bounded_by_the_rows():
    assert expert_capacity(600, 8, 1.25) == 96  # 93.75 -> 96
    assert expert_capacity(600, 8, 1.0) == 80  # 75 -> 80
    assert expert_capacity(600, 8, 100.0) == 600
    assert expert_capacity(3, 64, 0.01) == 3  # 8, but never more than the rows


def test_capacity_grid_uses_the_model_expert_count_for_a_device_share():
    """Under expert parallelism the dispatch sees its local experts (the rest marked "not
    here") but sizes the grid from the model's expert count: here 40 slots for ~75 rows per
    local expert, so about half of the share's assignments go through the overflow loop;
    the result is still exact."""
    x, gate_up, down = _weights()
    idx, w = _routing("random", seed=3)
    local = EXPERTS // 2
    away = idx >= local
    marked = jnp.where(away, local, idx)
    want_y, want_grads = _value_and_grads(
        "dense", x, jnp.where(away, 0, idx), jnp.where(away, 0.0, w), gate_up, down
    )

    share = functools.partial(
        capacity_experts, capacity_factor=0.5, block_size=16, num_experts=EXPERTS
    )
    y, grads = _value_and_grads(share, x, marked, w, gate_up[:local], down[:local])
    np.testing.assert_allclose(y, want_y, atol=1e-5)
    np.testing.assert_allclose(grads[0], want_grads[0], atol=1e-4)
    np.testing.assert_allclose(grads[1], jnp.where(away, 0.0, want_grads[1]), atol=1e-4)
    np.testing.assert_allclose(grads[2][:local], want_grads[2][:local], atol=1e-4)
    np.testing.assert_allclose(grads[3][:local], want_grads[3][:local], atol=1e-4)
