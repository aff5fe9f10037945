"""Policy-gradient losses for HSA-RL: GSPO, GSPO-token, token-level PPO/GRPO, KL estimators.

Algorithm. Rollouts are sampled from π_old and give per-token log-probs ``old_logp``; the
learner recomputes ``logp`` under π_θ. With token mask m (1 on policy-sampled tokens) and
Δ_t = logπ_θ(y_t) − logπ_old(y_t):

* GSPO (arXiv 2507.18071), the HSA-RL objective: one importance ratio per sequence,
  ``s_i = exp(Σ_t m_t Δ_t / Σ_t m_t)`` (length-normalised), and the clipped surrogate
  ``L_i = −min(s_i Â_i, clip(s_i, 1 − ε_low, 1 + ε_high) Â_i)``, averaged over sequences. The
  paper uses ε_low = 3e-4, ε_high = 4e-4 and no KL term.
* GSPO-token: ``log s_{i,t} = sg[log s_i] + logπ_θ(y_t) − sg[logπ_θ(y_t)]``; its value is s_i at
  every token but it admits per-token advantages. With per-sequence advantages it equals GSPO
  in value and gradient (tested).
* Token-level PPO/GRPO: the same clipped surrogate with per-token ratios exp(Δ_t).
* KL to a reference policy with Schulman's estimators k1/k2/k3.

Loss aggregation (``aggregation``): ``"token-mean"`` averages over all unmasked tokens of the
batch; ``"seq-mean-token-mean"`` averages each sequence over its tokens, then over sequences;
``"seq-mean-token-sum"`` sums each sequence, then averages over sequences. Sequences without any
unmasked token (padding rows, rows dropped by zero-advantage filtering — multiply the filter's
keep mask into ``mask``) are left out of every denominator. Every function is wrapped in
``jax.jit`` with its mode strings static, and nests inside a caller's jitted train step.

Numerical safety. Masked positions are replaced (not multiplied) by 0, so garbage or ±inf
log-probs on padding cannot leak NaN into values or gradients; log-ratios are clamped to
``±max_log_ratio`` (default 20) before ``exp``, so extreme policy drift gives a finite, if
large, loss instead of inf. Past the clamp the ratio is constant and its gradient 0.

Only array math lives here; advantages come from `rl.advantages`, models from `models`.
`check_mask` and `logits_pair` are the input checks of the distillation and draft-head losses
(`rl.distill`, `rl.mtp`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")

_sg = jax.lax.stop_gradient


def _check_pair(name_a, a, name_b, b):
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {a.shape} and {b.shape}"
        )


def check_mask(mask, shape) -> jax.Array:
    """`mask` as f32, checked to have `shape` (the per-position losses' shape)."""
    mask = jnp.asarray(mask, jnp.float32)
    if mask.shape != tuple(shape):
        raise ValueError(f"mask must have shape {tuple(shape)}, got {mask.shape}")
    return mask


def logits_pair(a, b) -> tuple[jax.Array, jax.Array]:
    """Two logit arrays over the same vocabulary, upcast to f32 and checked to share a shape."""
    a = jnp.asarray(a, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    if a.shape != b.shape:
        raise ValueError(
            f"logits must share a shape (same vocabulary), got {a.shape} and {b.shape}"
        )
    return a, b


def _check_token_inputs(logp, old_logp, mask):
    logp, old_logp, mask = (jnp.asarray(x) for x in (logp, old_logp, mask))
    if logp.ndim != 2:
        raise ValueError(f"logp must be f32[N, T], got shape {logp.shape}")
    _check_pair("logp", logp, "old_logp", old_logp)
    _check_pair("logp", logp, "mask", mask)
    return logp, old_logp, mask.astype(jnp.float32)


@functools.partial(jax.jit, static_argnames="mode")
def aggregate_loss(values, mask, mode: str = "token-mean") -> jax.Array:
    """Reduces per-token losses to a scalar with one of `AGGREGATIONS`.

    Args:
      values: f32[N, T] per-token loss; masked entries may be anything, even inf or NaN.
      mask: f32[N, T] token weights (1 on tokens that count, 0 elsewhere).
      mode: ``"token-mean"`` (Σ m·l / Σ m), ``"seq-mean-token-mean"`` (mean over non-empty
        sequences of Σ_t m·l / Σ_t m) or ``"seq-mean-token-sum"`` (mean over non-empty
        sequences of Σ_t m·l).

    Returns:
      f32[] loss; 0 when the mask is all zero.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGGREGATIONS}")
    mask = jnp.asarray(mask, jnp.float32)
    _check_pair("values", jnp.asarray(values), "mask", mask)
    weighted = jnp.where(mask > 0, values, 0.0) * mask
    if mode == "token-mean":
        total = jnp.sum(mask)
        return jnp.sum(weighted) / jnp.where(total > 0, total, 1.0)
    tokens = jnp.sum(mask, axis=-1)
    seq = jnp.sum(weighted, axis=-1)
    if mode == "seq-mean-token-mean":
        seq = seq / jnp.maximum(tokens, 1e-8)
    nonempty = tokens > 0
    return jnp.sum(jnp.where(nonempty, seq, 0.0)) / jnp.maximum(jnp.sum(nonempty), 1)


@functools.partial(jax.jit, static_argnames="kind")
def kl_penalty(logp, ref_logp, *, kind: str = "k3", max_log_ratio: float = 20.0) -> jax.Array:
    """Per-token estimators of KL(π_θ ‖ π_ref) on tokens sampled from π_θ.

    With ℓ = logπ_θ(y), ℓ_ref = logπ_ref(y) and ``r = ℓ_ref − ℓ`` (clamped to ±max_log_ratio):
    ``k1 = −r`` (unbiased, high variance, can be negative); ``k2 = r²/2`` (biased, low variance);
    ``k3 = exp(r) − r − 1`` (unbiased, non-negative, low variance).

    Args:
      logp: f32[...] log-probs of the sampled tokens under the policy.
      ref_logp: f32[...] log-probs of the same tokens under the reference.
      kind: one of `KL_ESTIMATORS`.
      max_log_ratio: clamp on |r| so k3's exp stays finite.

    Returns:
      f32[...] per-token estimate; aggregate it with `aggregate_loss`.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_ESTIMATORS}")
    logp, ref_logp = jnp.asarray(logp), jnp.asarray(ref_logp)
    _check_pair("logp", logp, "ref_logp", ref_logp)
    r = jnp.clip(ref_logp - logp, -max_log_ratio, max_log_ratio)
    if kind == "k1":
        return -r
    if kind == "k2":
        return 0.5 * r**2
    return jnp.exp(r) - r - 1.0


def _clipped_surrogate(ratio, adv, eps_low, eps_high):
    """Per-element ``−min(ρA, clip(ρ)A)`` and which side (low/high) the clip is active on."""
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    active = clipped < unclipped  # the min picks the flat branch: zero gradient
    loss = -jnp.where(active, clipped, unclipped)
    return loss, active & (ratio < 1.0), active & (ratio > 1.0)


def _stats(ratio, low, high, weight, approx_kl):
    """Unweighted metrics over entries with ``weight > 0`` (ratio 1 when there are none)."""
    on = weight > 0
    count = jnp.sum(on)
    has = count > 0

    def mean(x):
        return jnp.sum(jnp.where(on, x, 0.0)) / jnp.maximum(count, 1)

    return {
        "clip_fraction": mean((low | high).astype(jnp.float32)),
        "clip_fraction_low": mean(low.astype(jnp.float32)),
        "clip_fraction_high": mean(high.astype(jnp.float32)),
        "ratio_mean": jnp.where(has, mean(ratio), 1.0),
        "ratio_min": jnp.where(has, jnp.min(ratio, where=on, initial=jnp.inf), 1.0),
        "ratio_max": jnp.where(has, jnp.max(ratio, where=on, initial=-jnp.inf), 1.0),
        "approx_kl": approx_kl,
    }


def _broadcast_advantages(advantages, shape):
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.shape == shape[:1]:
        return jnp.broadcast_to(advantages[:, None], shape)
    if advantages.shape != shape:
        raise ValueError(
            f"advantages must be f32[{shape[0]}] or f32{list(shape)}, got {advantages.shape}"
        )
    return advantages


@functools.partial(jax.jit, static_argnames="aggregation")
def ppo_clip_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float,
    eps_high: float,
    aggregation: str = "token-mean",
    max_log_ratio: float = 20.0,
):
    """Token-level PPO/GRPO clipped surrogate with per-token ratios ``exp(Δ_t)``.

    Args:
      logp: f32[N, T] log-probs of the sampled tokens under π_θ (differentiated).
      old_logp: f32[N, T] log-probs under the sampling policy π_old.
      advantages: f32[N] (broadcast over tokens) or f32[N, T].
      mask: f32[N, T] 1 on policy tokens that count in the loss.
      eps_low: clip ratios below 1 − eps_low (for A < 0).
      eps_high: clip ratios above 1 + eps_high (for A > 0); ``eps_high > eps_low`` is DAPO's
        clip-higher.
      aggregation: one of `AGGREGATIONS`.
      max_log_ratio: clamp on |Δ_t| before exp.

    Returns:
      ``(loss f32[], metrics dict[str, f32[]])``; metrics over unmasked tokens: clip_fraction
      (share where the clipped branch is active, i.e. zero gradient), its low/high split,
      ratio_mean/min/max, and approx_kl (k3 estimate of KL(π_θ ‖ π_old), a drift monitor).
    """
    logp, old_logp, mask = _check_token_inputs(logp, old_logp, mask)
    adv = _broadcast_advantages(advantages, logp.shape)
    on = mask > 0
    delta = jnp.where(on, logp - old_logp, 0.0)
    ratio = jnp.exp(jnp.clip(delta, -max_log_ratio, max_log_ratio))
    per_token, low, high = _clipped_surrogate(ratio, adv, eps_low, eps_high)
    loss = aggregate_loss(per_token, mask, aggregation)
    kl = aggregate_loss(kl_penalty(_sg(logp), old_logp, max_log_ratio=max_log_ratio), mask)
    metrics = _stats(_sg(ratio), low & on, high & on, mask, kl)
    return loss, metrics


@jax.jit
def sequence_log_ratio(logp, old_logp, mask) -> jax.Array:
    """GSPO's length-normalised sequence log-ratio ``Σ_t m Δ_t / Σ_t m``: f32[N, T] x3 -> f32[N].

    Rows without unmasked tokens give 0 (ratio 1).
    """
    logp, old_logp, mask = _check_token_inputs(logp, old_logp, mask)
    delta = jnp.where(mask > 0, logp - old_logp, 0.0) * mask
    return jnp.sum(delta, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1e-8)


@functools.partial(jax.jit, static_argnames="aggregation")
def gspo_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float,
    eps_high: float,
    aggregation: str = "seq-mean-token-mean",
    max_log_ratio: float = 20.0,
):
    """GSPO sequence-level clipped loss; per-token advantages select the GSPO-token form.

    * ``advantages: f32[N]`` — GSPO: ratio ``s_i`` per sequence, loss ``L_i`` per sequence.
      ``aggregation`` weights the L_i as the token form would: ``"seq-mean-token-mean"`` (the
      default, the GSPO objective) is the mean of L_i over non-empty sequences;
      ``"token-mean"`` weights each L_i by its token count |y_i|; ``"seq-mean-token-sum"`` is
      the mean of |y_i|·L_i.
    * ``advantages: f32[N, T]`` — GSPO-token: ``s_{i,t} = sg[s_i]·exp(ℓ_t − sg[ℓ_t])``, clipped
      per token, aggregated per ``aggregation``. With advantages constant along each row both
      forms give the same loss and gradient for every aggregation mode.

    A sequence whose ratio is clipped (s_i > 1 + ε_high with Â > 0, or s_i < 1 − ε_low with
    Â < 0) contributes exactly zero gradient.

    Args:
      logp: f32[N, T] log-probs of the sampled tokens under π_θ (differentiated).
      old_logp: f32[N, T] log-probs under the sampling policy.
      advantages: f32[N] or f32[N, T].
      mask: f32[N, T] 1 on policy tokens (times the zero-advantage keep mask).
      eps_low: lower clip range (paper: 3e-4).
      eps_high: upper clip range (paper: 4e-4).
      aggregation: one of `AGGREGATIONS`.
      max_log_ratio: clamp on |log s_i| before exp.

    Returns:
      ``(loss f32[], metrics dict[str, f32[]])`` with the keys of `ppo_clip_loss`; ratio stats
      and clip fractions are over non-empty sequences (sequence form) or unmasked tokens
      (token form).
    """
    logp, old_logp, mask = _check_token_inputs(logp, old_logp, mask)
    advantages = jnp.asarray(advantages, jnp.float32)
    log_s = jnp.clip(sequence_log_ratio(logp, old_logp, mask), -max_log_ratio, max_log_ratio)
    kl = aggregate_loss(kl_penalty(_sg(logp), old_logp, max_log_ratio=max_log_ratio), mask)
    if advantages.ndim == 1:
        _broadcast_advantages(advantages, logp.shape)  # validates the shape
        s = jnp.exp(log_s)
        seq_loss, low, high = _clipped_surrogate(s, advantages, eps_low, eps_high)
        per_token = jnp.broadcast_to(seq_loss[:, None], logp.shape)
        loss = aggregate_loss(per_token, mask, aggregation)
        nonempty = jnp.sum(mask, axis=-1) > 0
        return loss, _stats(_sg(s), low & nonempty, high & nonempty, nonempty, kl)
    adv = _broadcast_advantages(advantages, logp.shape)
    on = mask > 0
    token_logp = jnp.where(on, logp, 0.0)
    s_t = jnp.exp(_sg(log_s)[:, None] + token_logp - _sg(token_logp))
    per_token, low, high = _clipped_surrogate(s_t, adv, eps_low, eps_high)
    loss = aggregate_loss(per_token, mask, aggregation)
    return loss, _stats(_sg(s_t), low & on, high & on, mask, kl)
