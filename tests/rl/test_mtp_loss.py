"""Hand-computed tests of the MTP draft head's math: labels, cross-entropy, acceptance."""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.mtp import acceptance_length, acceptance_probability, mtp_loss, mtp_targets

LN2, LN3 = math.log(2.0), math.log(3.0)


def test_mtp_targets_by_hand():
    ids = np.array([[11, 12, 13, 14, 15]])
    loss_mask = np.array([[0.0, 1.0, 1.0, 1.0, 1.0]])
    # the depth-1 head at t predicts token t+2: targets [13, 14, 15, -, -]
    targets, mask = mtp_targets(ids, loss_mask)
    np.testing.assert_array_equal(targets, [[13, 14, 15, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0, 0]])
    # packed segments [0,0,0,1,1]: t=1 -> t+2=3 and t=2 -> 4 cross into segment 1
    _, mask = mtp_targets(ids, loss_mask, segment_ids=np.array([[0, 0, 0, 1, 1]]))
    np.testing.assert_array_equal(mask, [[1, 0, 0, 0, 0]])
    _, mask = mtp_targets(ids, loss_mask, offset=9)
    assert mask.shape == (1, 5) and not np.any(mask)


def test_mtp_loss_by_hand():
    # logits [0, ln2, 0] -> p = [.25, .5, .25]; CE(target 1) = ln 2, CE(target 0) = ln 4
    logits = np.tile(np.array([0.0, LN2, 0.0], np.float32), (1, 3, 1))
    targets = np.array([[1, 0, -1]])  # the masked label is invalid on purpose
    mask = np.array([[1.0, 1.0, 0.0]])
    loss, metrics = mtp_loss(logits, targets, mask)
    np.testing.assert_allclose(loss, (LN2 + 2 * LN2) / 2, rtol=1e-6)  # 1.039721
    np.testing.assert_allclose(metrics["mtp_top1"], 0.5)  # argmax 1 hits position 0 only
    assert metrics["mtp_tokens"] == 2.0
    # ∂/∂logits = (p - onehot)/2 on counted positions
    grad = jax.grad(lambda x: mtp_loss(x, targets, mask)[0])(logits)
    np.testing.assert_allclose(
        grad[0], [[0.125, -0.25, 0.125], [-0.375, 0.25, 0.125], [0, 0, 0]], atol=1e-6
    )


def test_acceptance_probability_by_hand_and_from_first_principles():
    target = np.array([[0.0, 0.0]])  # p = [.5, .5]
    draft = np.array([[LN3, 0.0]])  # q = [.75, .25]
    # Σ min(p, q) = .5 + .25 = .75; speculative sampling: Σ_y q(y) min(1, p(y)/q(y)) = .5 + .25
    np.testing.assert_allclose(acceptance_probability(draft, target), [0.75], rtol=1e-6)
    p, q = np.array([0.5, 0.5]), np.array([0.75, 0.25])
    np.testing.assert_allclose(np.sum(q * np.minimum(1, p / q)), 0.75)
    # temperature 2: q = [√3, 1]/(√3 + 1) = [.633975, .366025] -> .5 + .366025 = .866025
    np.testing.assert_allclose(
        acceptance_probability(draft, target, temperature=2.0), [0.866025], rtol=1e-6
    )
    np.testing.assert_allclose(acceptance_probability(target, target), [1.0])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        acceptance_probability(draft, target, temperature=0.0)


def test_acceptance_length_by_hand():
    ones = np.ones((1, 3))
    # α = .5, k = 2: E_0 = E_1 = 1 + .5 + .25 = 1.75, E_2 = 1 + .5 (α past the end is 0) -> 5/3
    np.testing.assert_allclose(acceptance_length(0.5 * ones, ones, num_draft_tokens=2), 5 / 3)
    # k = 1: every E_t = 1.5
    np.testing.assert_allclose(acceptance_length(0.5 * ones, ones, num_draft_tokens=1), 1.5)
    # greedy 0/1 matches [1,1,0,1], k=2: E = [3, 2, 1, 2] -> 2
    alpha = np.array([[1.0, 1.0, 0.0, 1.0]])
    np.testing.assert_allclose(acceptance_length(alpha, np.ones((1, 4)), num_draft_tokens=2), 2.0)
    # a masked position breaks the chain and is not a start: α=[1, (1), 1], k=2 -> E = [2, 2] -> 2
    np.testing.assert_allclose(
        acceptance_length(ones, np.array([[1.0, 0.0, 1.0]]), num_draft_tokens=2), 2.0
    )
    # constant α = .6, T = 50, k = 3: 48 starts at (1 - .6⁴)/(1 - .6) = 2.176, then 1.96 and 1.6
    alpha = np.full((2, 50), 0.6)
    np.testing.assert_allclose(
        acceptance_length(alpha, np.ones((2, 50)), num_draft_tokens=3),
        (48 * 2.176 + 1.96 + 1.6) / 50,
        rtol=1e-6,
    )
    assert acceptance_length(alpha, np.zeros((2, 50)), num_draft_tokens=3) == 1.0


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="targets must have shape"):
        mtp_loss(np.zeros((1, 2, 3)), np.zeros((1, 3), jnp.int32), np.ones((1, 3)))
    with pytest.raises(ValueError, match="same vocabulary"):
        acceptance_probability(np.zeros((2, 3)), np.zeros((2, 4)))


# ---------------------------------------------------------------- properties and shapes


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_acceptance_in_range_and_one_minus_total_variation(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=6))
    logits = hnp.arrays(np.float32, shape, elements=st.floats(-30, 30, width=32))
    s, t = data.draw(logits), data.draw(logits)
    alpha = np.asarray(acceptance_probability(s, t))
    assert np.all((alpha >= 0) & (alpha <= 1))
    # Σ min(p, q) = 1 - TV(p, q), computed from first principles
    p, q = jax.nn.softmax(t), jax.nn.softmax(s)
    np.testing.assert_allclose(alpha, 1 - 0.5 * np.abs(p - q).sum(-1), atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 5, 7), (3, 4, 33)])
def test_mtp_functions_jit_over_shapes_and_match_numpy(shape):
    # The public functions are jitted themselves: one program per shape.
    rng = np.random.default_rng(sum(shape))
    draft, target = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
    mask = (rng.random(shape[:2]) < 0.6).astype(np.float32)
    p = np.exp(draft) / np.exp(draft).sum(-1, keepdims=True)
    labels = rng.integers(0, shape[-1], shape[:2])
    loss, _ = mtp_loss(draft, labels, mask)
    manual = -np.log(np.take_along_axis(p, labels[..., None], -1)[..., 0])
    np.testing.assert_allclose(
        loss, (manual * mask).sum() / max(mask.sum(), 1), rtol=1e-5, atol=1e-6
    )
    length = acceptance_length(acceptance_probability(draft, target), mask, num_draft_tokens=3)
    assert 1.0 <= float(length) <= 4.0
