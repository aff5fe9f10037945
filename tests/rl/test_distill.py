"""Hand-computed tests of General OPD (reverse KL) and MTP adaptation (loss, acceptance)."""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl import (
    acceptance_length,
    acceptance_probability,
    distill,
    mtp_loss,
    mtp_targets,
    opd_token_advantages,
    sampled_reverse_kl_loss,
    token_reverse_kl,
)

LN2, LN3 = math.log(2.0), math.log(3.0)
# p_S = [.5, .5], p_T = [.75, .25]:
# KL(p_S ‖ p_T) = .5 ln(.5/.75) + .5 ln(.5/.25) = .5(-0.405465) + .5(0.693147) = 0.143841
KL_HAND = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2.0)


# ---------------------------------------------------------------- exact reverse KL


def test_reverse_kl_by_hand_and_shift_invariant():
    # same distributions shifted: huge student logits (exact in f32) and a teacher shift small
    # enough that ln 3 + 8 keeps 1e-6 precision in f32
    student = np.array([[[0.0, 0.0], [1000.0, 1000.0]]])
    teacher = np.array([[[LN3, 0.0], [LN3 + 8.0, 8.0]]])
    np.testing.assert_allclose(token_reverse_kl(student, teacher), [[KL_HAND, KL_HAND]], rtol=1e-5)
    np.testing.assert_allclose(KL_HAND, 0.143841, atol=1e-6)
    loss = distill.reverse_kl(student, teacher, np.array([[1.0, 0.0]]))
    np.testing.assert_allclose(loss, KL_HAND, rtol=1e-5)


def test_reverse_kl_gradient_by_hand_and_teacher_is_frozen():
    # ∂KL/∂s_j = p_j (ln p_j - ln q_j - KL) = [.5(-0.405465 - 0.143841), .5(0.693147 - 0.143841)]
    #          = [-0.274653, 0.274653]
    student = np.array([[[0.0, 0.0]]])
    teacher = np.array([[[LN3, 0.0]]])
    mask = np.ones((1, 1))
    g_s, g_t = jax.grad(distill.reverse_kl, argnums=(0, 1))(student, teacher, mask)
    np.testing.assert_allclose(g_s, [[[-0.274653, 0.274653]]], atol=1e-6)
    assert np.all(np.asarray(g_t) == 0.0)


def test_reverse_kl_with_masked_vocabulary_slots_is_finite():
    # a padded vocabulary slot at -inf in both models contributes nothing
    student = np.array([[[0.0, 0.0, -jnp.inf]]])
    teacher = np.array([[[LN3, 0.0, -jnp.inf]]])
    mask = np.ones((1, 1))
    np.testing.assert_allclose(distill.reverse_kl(student, teacher, mask), KL_HAND, rtol=1e-6)
    grad = jax.grad(distill.reverse_kl)(student, teacher, mask)
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad[0, 0, :2], [-0.274653, 0.274653], atol=1e-6)


def test_exact_kl_gradient_is_the_expectation_of_the_sampled_estimator():
    # ∇KL = Σ_y p_S(y) (ln p_S(y) - ln p_T(y)) ∇ln p_S(y): enumerate every token y of a
    # 5-word vocabulary, take the sampled-token loss's gradient for that y, weight by p_S(y).
    rng = np.random.default_rng(0)
    s_logits = jnp.asarray(rng.normal(size=5), jnp.float32)
    t_logits = jnp.asarray(rng.normal(size=5), jnp.float32)
    one = np.ones((1, 1))

    def sampled(s, y):
        logp_s = jax.nn.log_softmax(s)[y].reshape(1, 1)
        logp_t = jax.nn.log_softmax(t_logits)[y].reshape(1, 1)
        return sampled_reverse_kl_loss(logp_s, logp_t, one)

    @jax.jit
    def expectations(s):  # Σ_y p_S(y) · (value, gradient) of the sampled loss at token y
        values, grads = jax.vmap(jax.value_and_grad(sampled), (None, 0))(s, jnp.arange(5))
        p = jax.nn.softmax(s)
        return p @ values, p @ grads

    expected_value, expected_grad = expectations(s_logits)
    exact, exact_grad = jax.value_and_grad(distill.reverse_kl)(
        s_logits[None, None], t_logits[None, None], one
    )
    np.testing.assert_allclose(exact, expected_value, rtol=1e-5)
    np.testing.assert_allclose(exact_grad[0, 0], expected_grad, atol=1e-6)


# ---------------------------------------------------------------- sampled-token estimator


def test_opd_token_advantages_and_sampled_loss_by_hand():
    student = np.array([[-1.0, -2.0, -3.0]])
    teacher = np.array([[-1.5, -1.0, 0.0]])
    mask = np.array([[1.0, 1.0, 0.0]])
    # A_t = -(ln π_S - ln π_T) = [-(−1 + 1.5), -(−2 + 1)] = [-0.5, 1.0]; masked -> 0
    np.testing.assert_allclose(opd_token_advantages(student, teacher, mask), [[-0.5, 1.0, 0.0]])
    # value: token-mean of k1 = (0.5 - 1.0)/2 = -0.25; gradient -A_t/2 = [0.25, -0.5, 0]
    loss = sampled_reverse_kl_loss(student, teacher, mask)
    np.testing.assert_allclose(loss, -0.25)
    grad = jax.grad(sampled_reverse_kl_loss)(student, teacher, mask)
    np.testing.assert_allclose(grad, [[0.25, -0.5, 0.0]])


# ---------------------------------------------------------------- MTP


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
    with pytest.raises(ValueError, match="same vocabulary"):
        token_reverse_kl(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"mask must have shape \(1, 2\)"):
        distill.reverse_kl(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), np.ones((2, 1)))
    with pytest.raises(ValueError, match="targets must have shape"):
        mtp_loss(np.zeros((1, 2, 3)), np.zeros((1, 3), jnp.int32), np.ones((1, 3)))


# ---------------------------------------------------------------- properties and shapes


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(np.float32, (2, 3, 6), elements=st.floats(-30, 30, width=32)),
    hnp.arrays(np.float32, (2, 3, 6), elements=st.floats(-30, 30, width=32)),
)
def test_reverse_kl_nonnegative_zero_on_self_and_acceptance_in_range(s, t):
    kl = np.asarray(token_reverse_kl(s, t))
    assert np.all(kl >= -1e-5) and np.all(np.isfinite(kl))
    np.testing.assert_allclose(token_reverse_kl(s, s), np.zeros((2, 3)), atol=1e-5)
    alpha = np.asarray(acceptance_probability(s, t))
    assert np.all((alpha >= 0) & (alpha <= 1))
    # Σ min(p, q) = 1 - TV(p, q), computed from first principles
    p, q = jax.nn.softmax(t), jax.nn.softmax(s)
    np.testing.assert_allclose(alpha, 1 - 0.5 * np.abs(p - q).sum(-1), atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 5, 7), (3, 4, 33)])
def test_distill_functions_jit_over_shapes_and_match_numpy(shape):
    # The public functions are jitted themselves: one program per shape.
    rng = np.random.default_rng(sum(shape))
    s = rng.normal(size=shape).astype(np.float32)
    t = rng.normal(size=shape).astype(np.float32)
    mask = (rng.random(shape[:2]) < 0.6).astype(np.float32)
    ps = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    pt = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
    per_token = (ps * (np.log(ps) - np.log(pt))).sum(-1) * mask
    rows = mask.sum(1) > 0
    expected = per_token.sum(1)[rows].mean() if rows.any() else 0.0
    kl = distill.reverse_kl(s, t, mask, aggregation="seq-mean-token-sum")
    np.testing.assert_allclose(kl, expected, rtol=1e-5, atol=1e-6)
    targets = rng.integers(0, shape[-1], shape[:2])
    loss, _ = mtp_loss(s, targets, mask)
    manual = -np.log(np.take_along_axis(ps, targets[..., None], -1)[..., 0])
    np.testing.assert_allclose(
        loss, (manual * mask).sum() / max(mask.sum(), 1), rtol=1e-5, atol=1e-6
    )
    length = acceptance_length(acceptance_probability(s, t), mask, num_draft_tokens=3)
    assert 1.0 <= float(length) <= 4.0
