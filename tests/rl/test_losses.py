"""Hand-computed tests of GSPO, GSPO-token, the token-level PPO loss, aggregation and KL."""

import functools
import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl import AGGREGATIONS, KL_ESTIMATORS, aggregate_loss, gspo_loss, kl_penalty, ppo_clip_loss

PAPER_EPS = {"eps_low": 3e-4, "eps_high": 4e-4}
E01 = math.exp(0.1)  # 1.105171

# REFERENCE.md §6: masked Δ = [0.1, -0.2, 0.4] (the 4th token is masked out) -> s = e^0.1
OLD = np.full((1, 4), -1.0, np.float32)
LOGP = OLD + np.array([[0.1, -0.2, 0.4, 5.0]], np.float32)
MASK = np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)
DEFAULT_AGGREGATION = {gspo_loss: "seq-mean-token-mean", ppo_clip_loss: "token-mean"}


@functools.partial(jax.jit, static_argnames=("fn", "aggregation"))
def _value_and_grad(fn, logp, old, adv, mask, eps_low, eps_high, aggregation):
    def loss(lp):
        return fn(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, aggregation=aggregation)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(logp)
    return value, metrics, grad


def loss_metrics_grad(fn, logp, old, adv, mask, *, eps_low, eps_high, aggregation=None):
    """(loss, metrics, ∂loss/∂logp) from one compiled program (fewer compiles, faster tests)."""
    aggregation = aggregation or DEFAULT_AGGREGATION[fn]
    adv = np.asarray(adv, np.float32)
    value, metrics, grad = _value_and_grad(fn, logp, old, adv, mask, eps_low, eps_high, aggregation)
    return value, metrics, np.asarray(grad)


# ---------------------------------------------------------------- aggregation


def test_aggregation_modes_by_hand():
    values = np.array([[1.0, 2.0, 3.0], [4.0, jnp.nan, jnp.inf], [9.0, 9.0, 9.0]])
    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 empty
    # token-mean: (1 + 2 + 4)/3; seq-mean-token-mean: ((1+2)/2 + 4/1)/2; seq-mean-token-sum: (3 + 4)/2
    expected = {"token-mean": 7 / 3, "seq-mean-token-mean": 2.75, "seq-mean-token-sum": 3.5}
    for mode, value in expected.items():
        np.testing.assert_allclose(aggregate_loss(values, mask, mode), value, rtol=1e-6)
        assert aggregate_loss(values, np.zeros_like(mask), mode) == 0.0
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_loss(values, mask, "mean")


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_reference_vector():
    # ℓθ = -1.0, ℓref = -1.5, r = ℓref - ℓθ = -0.5:
    # k1 = -r = 0.5; k2 = r²/2 = 0.125; k3 = e^-0.5 + 0.5 - 1 = 0.606531 - 0.5 = 0.106531
    logp, ref = np.array([-1.0], np.float32), np.array([-1.5], np.float32)
    for kind, value in {"k1": 0.5, "k2": 0.125, "k3": 0.106531}.items():
        np.testing.assert_allclose(kl_penalty(logp, ref, kind=kind), [value], atol=1e-6)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, kind="k4")


def test_kl_estimators_finite_at_extreme_log_ratios():
    logp = np.array([0.0, 0.0, -200.0], np.float32)
    ref = np.array([-100.0, 100.0, 0.0], np.float32)

    @jax.jit
    def all_kinds(lp):
        return [
            jax.value_and_grad(lambda x, k=k: kl_penalty(x, ref, kind=k).sum())(lp)
            for k in KL_ESTIMATORS
        ]

    for value, grad in all_kinds(logp):
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(grad))
    # k3 >= 0 everywhere; r clamped at ±20: k3(r=20) = e^20 - 21
    np.testing.assert_allclose(kl_penalty(logp, ref)[1], math.exp(20) - 21, rtol=1e-6)


# ---------------------------------------------------------------- GSPO (REFERENCE.md §6)


def test_gspo_reference_vector_positive_advantage_is_clipped_with_zero_gradient():
    loss, metrics, grad = loss_metrics_grad(gspo_loss, LOGP, OLD, [1.0], MASK, **PAPER_EPS)
    # s = e^{(0.1 - 0.2 + 0.4)/3} = e^0.1 = 1.105171 > 1 + 4e-4 -> min picks clip(s)·A = 1.0004
    np.testing.assert_allclose(metrics["ratio_mean"], E01, rtol=1e-6)
    np.testing.assert_allclose(loss, -1.0004, rtol=1e-6)
    assert metrics["clip_fraction"] == 1.0 and metrics["clip_fraction_high"] == 1.0
    assert np.all(grad == 0.0)
    direct, _ = gspo_loss(LOGP, OLD, np.array([1.0], np.float32), MASK, **PAPER_EPS)
    np.testing.assert_allclose(direct, -1.0004, rtol=1e-6)


def test_gspo_reference_vector_negative_advantage_keeps_gradient():
    # A = -1: s·A = -1.105171 < clip(s)·A = -1.0004, so the unclipped branch is the min:
    # loss = 1.105171, ∂loss/∂ℓ_t = -A · s · m_t/|y| = 1.105171/3 = 0.368390 on the 3 masked-in tokens
    loss, metrics, grad = loss_metrics_grad(gspo_loss, LOGP, OLD, [-1.0], MASK, **PAPER_EPS)
    np.testing.assert_allclose(loss, E01, rtol=1e-6)
    assert metrics["clip_fraction"] == 0.0
    np.testing.assert_allclose(grad, [[E01 / 3, E01 / 3, E01 / 3, 0.0]], rtol=1e-6)


def test_gspo_clipped_sequence_contributes_exactly_zero_gradient_in_a_batch():
    # seq 0: the reference sequence, A = +1 -> clipped. seq 1: Δ = 0 (s = 1), A = +2 -> unclipped.
    # loss = mean(-1.0004, -2) = -1.5002; seq 1 grad = -A·s·(1/|y|)·(1/2 sequences) = -1/3 per token
    logp = np.concatenate([LOGP, OLD])
    old = np.concatenate([OLD, OLD])
    mask = np.concatenate([MASK, MASK])
    loss, metrics, grad = loss_metrics_grad(gspo_loss, logp, old, [1.0, 2.0], mask, **PAPER_EPS)
    np.testing.assert_allclose(loss, -1.5002, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_fraction"], 0.5)
    np.testing.assert_allclose(metrics["ratio_max"], E01, rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_min"], 1.0)
    assert np.all(grad[0] == 0.0)
    np.testing.assert_allclose(grad[1], [-1 / 3, -1 / 3, -1 / 3, 0.0], rtol=1e-6)


def test_gspo_token_with_per_token_advantages_by_hand():
    adv = np.array([[1.0, -1.0, 0.5, 7.0]], np.float32)  # the masked 4th entry must not matter
    # ε = 0.2: s = 1.105171 inside [0.8, 1.2], nothing clipped.
    # loss = -s·(1 - 1 + 0.5)/3 = -0.184195; ∂/∂ℓ_t = -s·A_t/3 (no gradient through sg[log s])
    wide = {"eps_low": 0.2, "eps_high": 0.2}
    loss, _, grad = loss_metrics_grad(gspo_loss, LOGP, OLD, adv, MASK, **wide)
    np.testing.assert_allclose(loss, -E01 * 0.5 / 3, rtol=1e-6)
    np.testing.assert_allclose(grad, [[-E01 / 3, E01 / 3, -E01 * 0.5 / 3, 0.0]], rtol=1e-6)
    # paper ε: the A > 0 tokens are clipped at 1.0004 (zero gradient), the A < 0 token is not:
    # loss = (-1.0004 + 1.105171 - 0.5·1.0004)/3 = -0.131810
    loss, metrics, grad = loss_metrics_grad(gspo_loss, LOGP, OLD, adv, MASK, **PAPER_EPS)
    np.testing.assert_allclose(loss, (-1.0004 + E01 - 0.5002) / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(grad, [[0.0, E01 / 3, 0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_and_gspo_token_agree_for_per_sequence_advantages(aggregation):
    rng = np.random.default_rng(0)
    n, t = 6, 9
    old = rng.normal(-2.0, 0.5, (n, t)).astype(np.float32)
    logp = old + rng.normal(0.0, 0.3, (n, t)).astype(np.float32)
    lengths = np.array([9, 5, 1, 0, 7, 3])  # includes an empty row
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    adv = np.array([1.0, -1.0, 0.5, 2.0, -0.3, 1.5], np.float32)
    kw = {"eps_low": 0.05, "eps_high": 0.08, "aggregation": aggregation}
    seq_loss, seq_metrics, seq_grad = loss_metrics_grad(gspo_loss, logp, old, adv, mask, **kw)
    tok_adv = np.repeat(adv[:, None], t, axis=1)
    tok_loss, _, tok_grad = loss_metrics_grad(gspo_loss, logp, old, tok_adv, mask, **kw)
    assert 0 < seq_metrics["clip_fraction"] < 1  # both branches are exercised
    assert np.any(seq_grad != 0) and np.all(seq_grad[mask == 0] == 0)
    np.testing.assert_allclose(seq_loss, tok_loss, rtol=1e-6)
    np.testing.assert_allclose(seq_grad, tok_grad, rtol=1e-5, atol=1e-7)


def np_gspo(logp, old, adv, mask, eps_low, eps_high):
    """First-principles GSPO: per-sequence s_i, clipped surrogate, mean over non-empty rows."""
    lengths = mask.sum(1)
    log_s = np.where(lengths > 0, ((logp - old) * mask).sum(1) / np.maximum(lengths, 1), 0.0)
    s = np.exp(log_s)
    per_seq = -np.minimum(s * adv, np.clip(s, 1 - eps_low, 1 + eps_high) * adv)
    return per_seq[lengths > 0].mean() if (lengths > 0).any() else 0.0


@pytest.mark.parametrize("shape", [(0, 3), (2, 0), (1, 1), (3, 7), (5, 16)])
def test_gspo_jits_over_shapes_and_matches_reference(shape):
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    old = rng.normal(-2.0, 0.5, shape).astype(np.float32)
    logp = old + rng.normal(0.0, 0.1, shape).astype(np.float32)
    mask = (rng.random(shape) < 0.7).astype(np.float32)
    adv = rng.normal(size=shape[0]).astype(np.float32)
    loss, _ = jax.jit(gspo_loss, static_argnames="aggregation")(
        logp, old, adv, mask, eps_low=0.05, eps_high=0.05
    )
    np.testing.assert_allclose(
        loss, np_gspo(logp, old, adv, mask, 0.05, 0.05), rtol=1e-5, atol=1e-6
    )


# ---------------------------------------------------------------- token-level PPO/GRPO


def test_ppo_clip_loss_by_hand():
    # ε = 0.2 -> ratio range [0.8, 1.2]; ratios ρ = [1.5, 0.5, 1.1, 0.5], A = [1, 1, -1, -1]
    #   t0: ρA = 1.5, clip·A = 1.2  -> min 1.2 (clipped high, grad 0), loss -1.2
    #   t1: ρA = 0.5, clip·A = 0.8  -> min 0.5 (unclipped),            loss -0.5
    #   t2: ρA = -1.1, clip·A = -1.1 -> unclipped,                      loss 1.1
    #   t3: ρA = -0.5, clip·A = -0.8 -> min -0.8 (clipped low, grad 0), loss 0.8
    # token-mean = (-1.2 - 0.5 + 1.1 + 0.8)/4 = 0.05; ∂/∂ℓ_t = -ρ_t A_t/4 on unclipped tokens
    old = np.zeros((1, 4), np.float32)
    logp = np.log(np.array([[1.5, 0.5, 1.1, 0.5]], np.float32))
    adv = np.array([[1.0, 1.0, -1.0, -1.0]], np.float32)
    mask = np.ones((1, 4), np.float32)
    loss, m, grad = loss_metrics_grad(
        ppo_clip_loss, logp, old, adv, mask, eps_low=0.2, eps_high=0.2
    )
    np.testing.assert_allclose(loss, 0.05, atol=1e-6)
    np.testing.assert_allclose(
        ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)[0], 0.05, atol=1e-6
    )
    np.testing.assert_allclose(grad, [[0.0, -0.125, 0.275, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(
        [m["clip_fraction"], m["clip_fraction_low"], m["clip_fraction_high"]], [0.5, 0.25, 0.25]
    )
    np.testing.assert_allclose(
        [m["ratio_mean"], m["ratio_min"], m["ratio_max"]], [0.9, 0.5, 1.5], rtol=1e-6
    )
    # approx_kl = mean k3 with r = -Δ: [1/1.5 + ln1.5 - 1, 2 - ln2 - 1, 1/1.1 + ln1.1 - 1, 2 - ln2 - 1]
    #           = mean[0.072132, 0.306853, 0.004401, 0.306853] = 0.172560
    np.testing.assert_allclose(m["approx_kl"], 0.172560, atol=1e-6)


def test_ppo_clip_loss_per_sequence_advantages_and_aggregation():
    # Δ = 0 everywhere (ρ = 1, nothing clipped): per-token loss = -A_i.
    # A = [1, 3], lengths [2, 1]: token-mean (-1 - 1 - 3)/3; seq-mean-token-mean (-1 - 3)/2;
    # seq-mean-token-sum (-2 - 3)/2
    mask = np.array([[1.0, 1.0], [1.0, 0.0]], np.float32)
    zeros = np.zeros((2, 2), np.float32)
    expected = {"token-mean": -5 / 3, "seq-mean-token-mean": -2.0, "seq-mean-token-sum": -2.5}
    for mode, value in expected.items():
        loss, _ = ppo_clip_loss(
            zeros,
            zeros,
            np.array([1.0, 3.0], np.float32),
            mask,
            eps_low=0.2,
            eps_high=0.2,
            aggregation=mode,
        )
        np.testing.assert_allclose(loss, value, rtol=1e-6)
    with pytest.raises(ValueError, match=r"advantages must be f32\[2\]"):
        ppo_clip_loss(zeros, zeros, np.ones(3, np.float32), mask, eps_low=0.2, eps_high=0.2)


# ---------------------------------------------------------------- safety properties

logratio_st = hnp.arrays(
    np.float32, (3, 5), elements=st.sampled_from([-100.0, -3.0, -1e-3, 0.0, 0.5, 100.0])
)
mask_st = hnp.arrays(np.float32, (3, 5), elements=st.sampled_from([0.0, 1.0]))
adv_st = hnp.arrays(np.float32, (3,), elements=st.sampled_from([-2.0, 0.0, 1.0]))


@settings(max_examples=30, deadline=None)
@given(logratio_st, mask_st, adv_st)
def test_losses_finite_for_extreme_ratios_and_empty_masks(delta, mask, adv):
    old = np.full((3, 5), -2.0, np.float32)
    logp = old + delta
    old[mask == 0] = -np.inf  # garbage on padding must not leak
    kw = {"eps_low": 3e-4, "eps_high": 4e-4}  # aggregation's own safety is tested above
    for fn, a in (
        (gspo_loss, adv),
        (gspo_loss, np.repeat(adv[:, None], 5, 1)),
        (ppo_clip_loss, adv),
    ):
        loss, metrics, grad = loss_metrics_grad(fn, logp, old, a, mask, **kw)
        assert np.isfinite(loss) and np.all(np.isfinite(grad))
        assert all(np.isfinite(v) for v in metrics.values())
        assert np.all(grad[mask == 0] == 0.0)
