"""Hand-computed tests of General OPD: the exact reverse KL and the sampled-token estimator."""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl import (
    distill,
    opd_token_advantages,
    sampled_reverse_kl_loss,
    token_reverse_kl,
)

LN3 = math.log(3.0)
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


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="same vocabulary"):
        token_reverse_kl(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"mask must have shape \(1, 2\)"):
        distill.reverse_kl(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), np.ones((2, 1)))


# ---------------------------------------------------------------- properties and shapes


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(np.float32, (2, 3, 6), elements=st.floats(-30, 30, width=32)),
    hnp.arrays(np.float32, (2, 3, 6), elements=st.floats(-30, 30, width=32)),
)
def test_reverse_kl_nonnegative_and_zero_on_self(s, t):
    kl = np.asarray(token_reverse_kl(s, t))
    assert np.all(kl >= -1e-5) and np.all(np.isfinite(kl))
    np.testing.assert_allclose(token_reverse_kl(s, s), np.zeros((2, 3)), atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 5, 7), (3, 4, 33)])
def test_reverse_kl_jits_over_shapes_and_matches_numpy(shape):
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
