"""The segment-aware gated delta rule: hand-computed values, chunked == per-step recurrence,
state resets at segment boundaries (inside a chunk and on a chunk edge), gradients.

All checks share one input shape so each function compiles once.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models import chunked_gated_delta_rule, recurrent_gated_delta_rule

BATCH, LENGTH, HEADS, DK, DV, CHUNK = 3, 150, 3, 8, 5, 32


@functools.partial(jax.jit, static_argnames="chunk")
def both(q, k, v, g, beta, doc, state, chunk=CHUNK):
    """(chunked output, chunked state, recurrent output, recurrent state)."""
    o_c, s_c = chunked_gated_delta_rule(
        q, k, v, g, beta, doc, chunk_size=chunk, initial_state=state
    )
    o_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, doc, initial_state=state)
    return o_c, s_c, o_r, s_r


def _doc(segment_ids: np.ndarray) -> jnp.ndarray:
    """Running segment index, as the model derives it from segment ids."""
    start = np.concatenate(
        [np.ones((segment_ids.shape[0], 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1
    )
    return jnp.asarray(np.cumsum(start, 1) - 1)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    shape = (BATCH, LENGTH, HEADS)
    q = unit(rng.normal(size=(*shape, DK)))
    k = unit(rng.normal(size=(*shape, DK)))
    v = rng.normal(size=(*shape, DV))
    g = -np.exp(rng.normal(size=shape)) * 0.5
    beta = 1 / (1 + np.exp(-rng.normal(size=shape)))
    return tuple(jnp.asarray(a, jnp.float32) for a in (q, k, v, g, beta))


def _zero_state():
    return jnp.zeros((BATCH, HEADS, DK, DV))


# Row 0: boundaries inside a chunk (40), on a chunk edge (64), a padding run (100:).
# Row 1: a one-token segment at 127, a boundary on the edge at 128. Row 2: one segment.
PACKED = np.ones((BATCH, LENGTH), np.int32)
PACKED[0, 40:], PACKED[0, 64:], PACKED[0, 100:] = 2, 3, 0
PACKED[1, 127], PACKED[1, 128:] = 5, 6


def test_hand_computed_steps_and_reset():
    # Dk = Dv = 1, q = k = 1, decay 0.5, beta 0.5, v = (2, 4):
    # t0: S = 0, delta = (2 - 0) * .5 = 1, S = 1, o = 1
    # t1: S = .5, delta = (4 - .5) * .5 = 1.75, S = 2.25, o = 2.25
    # t1 starting a new segment: S = 0, delta = 2, S = 2, o = 2
    one = jnp.ones((2, 2, 1, 1))
    v = jnp.array([2.0, 4.0, 2.0, 4.0]).reshape(2, 2, 1, 1)
    g = jnp.full((2, 2, 1), np.log(0.5))
    beta = jnp.full((2, 2, 1), 0.5)
    doc = jnp.array([[0, 0], [0, 1]])
    o_c, s_c, o_r, s_r = both(one, one, v, g, beta, doc, jnp.zeros((2, 1, 1, 1)), chunk=2)
    for out, state in ((o_c, s_c), (o_r, s_r)):
        np.testing.assert_allclose(out.reshape(2, 2), [[1.0, 2.25], [1.0, 2.0]], rtol=1e-6)
        np.testing.assert_allclose(state.ravel(), [2.25, 2.0], rtol=1e-6)


def test_chunked_equals_recurrence_across_segments():
    o_c, s_c, o_r, s_r = both(*_inputs(), _doc(PACKED), _zero_state())
    np.testing.assert_allclose(o_c, o_r, atol=2e-6)
    np.testing.assert_allclose(s_c, s_r, atol=2e-6)


def test_chunked_equals_recurrence_from_an_initial_state():
    state = jnp.asarray(np.random.default_rng(3).normal(size=(BATCH, HEADS, DK, DV)), jnp.float32)
    o_c, s_c, o_r, s_r = both(*_inputs(), _doc(PACKED), state)
    np.testing.assert_allclose(o_c, o_r, atol=2e-6)
    np.testing.assert_allclose(s_c, s_r, atol=2e-6)
    # The first token continues the given state: outputs differ from a zero start.
    o_zero = both(*_inputs(), _doc(PACKED), _zero_state())[0]
    assert np.abs(np.asarray(o_c - o_zero))[:, :10].max() > 1e-3


def test_packed_segments_equal_separate_runs():
    inputs = _inputs()
    packed = both(*inputs, _doc(PACKED), _zero_state())[0]
    for row, (lo, hi) in [(0, (0, 40)), (0, (40, 64)), (0, (64, 100)), (1, (128, 150))]:
        # The segment alone, at the start of a row, followed by another segment.
        alone = [np.roll(a, -lo, axis=1) for a in inputs]
        seg = np.ones((BATCH, LENGTH), np.int32)
        seg[:, hi - lo :] = 2
        out = both(*alone, _doc(seg), _zero_state())[0]
        np.testing.assert_allclose(packed[row, lo:hi], out[row, : hi - lo], atol=2e-6)


def test_gradients_agree():
    # The chunked form has a hand-written backward pass: it must match autodiff of the
    # recurrence for every input, the initial state included, through both outputs.
    q, k, v, g, beta = _inputs()
    doc = _doc(PACKED)
    rng = np.random.default_rng(7)
    w = jnp.asarray(rng.normal(size=(BATCH, LENGTH, HEADS, DV)), jnp.float32)
    w_state = jnp.asarray(rng.normal(size=(BATCH, HEADS, DK, DV)), jnp.float32)
    state = jnp.asarray(rng.normal(size=(BATCH, HEADS, DK, DV)), jnp.float32)

    @jax.jit
    def grads(*args):
        def loss(args, index):
            results = both(*args[:5], doc, args[5])
            return jnp.sum(results[index] * w) + jnp.sum(results[index + 1] * w_state)

        return jax.grad(loss)(args, 0), jax.grad(loss)(args, 2)

    grads_chunk, grads_step = grads(q, k, v, g, beta, state)
    for name, a, b in zip(["q", "k", "v", "g", "beta", "state"], grads_chunk, grads_step):
        assert np.isfinite(np.asarray(a)).all(), name
        assert np.abs(np.asarray(b)).max() > 1e-3, name  # a gradient that flows
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=name)
