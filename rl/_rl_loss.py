"""The HSA-RL loss: GSPO's sequence-level clipped surrogate per segment, an optional k3 KL to
a frozen reference, as the sums of `hat_jax.train.LossOutput` (see `rl.losses` for the math).

A batch holds one segment per row (its context, then the tokens the policy sampled):
`loss_mask` 1 on the sampled tokens, `old_logprobs` the sampler's log-probs of those tokens
(aligned with them), `advantages` the segment's advantage on its tokens, and `fresh` 1 on the
rows of a rollout's first minibatch (sampled with the weights this step still has: there the
recomputed log-probs must equal the sampler's, and their mean absolute difference is the
`logprob_mismatch` the stage logs).

The objective is the mean over segments (GSPO's `seq-mean-token-mean`), so `total` is the sum
over segments and `weight` their count: gradient accumulation stays exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from hat_jax.train import LossOutput, model_token_logprobs, next_token_targets
from rl.losses import gspo_loss, kl_penalty

# The batch's keys and dtypes: one segment per row, [rows, T] each.
RL_KEYS = {"input_ids": "int32", "loss_mask": "int32", "segment_ids": "int32",
           "positions": "int32", "old_logprobs": "float32", "advantages": "float32",
           "fresh": "int32"}  # fmt: skip


def rl_loss(
    model: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    token_level: bool = False,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    aux_loss_coef: float = 0.0,
    logits_chunk: int = 0,
) -> LossOutput:
    """GSPO on the batch's segments (+ `kl_coef` x the KL to `model.reference`).

    Args:
      model: the policy (`model.policy` when the stage has a reference model too).
      batch: `RL_KEYS` rows (see the module docstring).
      rng: unused.
      eps_low, eps_high: GSPO's clip range (paper: 3e-4 / 4e-4).
      token_level: GSPO-token (per-token ratios sharing the sequence's) instead of GSPO.
      kl_coef: weight of the per-segment mean k3 KL to the frozen reference (0: none).
      kl_estimator: "k1", "k2" or "k3".
      aux_loss_coef: weight of the policy's MoE load-balancing loss.
      logits_chunk: > 0 computes the log-probs (the reference's too) this many positions at
        a time from the final hidden states: no `[B, T, V]` logits (see
        `hat_jax.train.model_token_logprobs`).

    Returns sums over segments (see `LossOutput`): weight = non-empty segments; metrics
    `clip_low`, `clip_high`, `ratio_mean`, `ratio_dev` (mean |s − 1|), `kl_old` (k3 of the
    old log-probs), `kl_ref`, `aux_loss`, and for the host's `logprob_mismatch`:
    `mismatch_sum` and `fresh_tokens`.
    """
    del rng
    policy = getattr(model, "policy", model)
    ids, pos, seg = batch["input_ids"], batch["positions"], batch["segment_ids"]
    out = policy(ids, positions=pos, segment_ids=seg)
    targets, weights = next_token_targets(batch)
    mask = weights.astype(jnp.float32)
    logp = model_token_logprobs(policy, out, targets, logits_chunk=logits_chunk)
    old = batch["old_logprobs"][:, 1:].astype(jnp.float32)
    tokens = jnp.sum(mask, axis=-1)
    nonempty = (tokens > 0).astype(jnp.float32)
    n = jnp.sum(nonempty)
    token_adv = batch["advantages"][:, 1:].astype(jnp.float32)
    if token_level:
        advantages = token_adv
    else:
        advantages = jnp.sum(token_adv * mask, -1) / jnp.maximum(tokens, 1.0)
    loss, stats = gspo_loss(logp, old, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    log_s = jnp.sum((jax.lax.stop_gradient(logp) - old) * mask, -1) / jnp.maximum(tokens, 1.0)
    ratio_dev = jnp.sum(jnp.abs(jnp.exp(log_s) - 1.0) * nonempty)
    fresh = mask * batch["fresh"][:, 1:].astype(jnp.float32)
    metrics = {
        "clip_low": stats["clip_fraction_low"] * n,
        "clip_high": stats["clip_fraction_high"] * n,
        "ratio_mean": stats["ratio_mean"] * n,
        "ratio_dev": ratio_dev,
        "kl_old": stats["approx_kl"] * n,
        "mismatch_sum": jnp.sum(jnp.abs(jax.lax.stop_gradient(logp) - old) * fresh),
        "fresh_tokens": jnp.sum(fresh),
    }
    total = loss * n
    if kl_coef:
        reference = model.reference(ids, positions=pos, segment_ids=seg)
        ref_logp = jax.lax.stop_gradient(
            model_token_logprobs(model.reference, reference, targets, logits_chunk=logits_chunk)
        )
        per_token = kl_penalty(logp, ref_logp, kind=kl_estimator)
        per_seq = jnp.sum(per_token * mask, -1) / jnp.maximum(tokens, 1.0)
        kl_sum = jnp.sum(per_seq * nonempty)
        total = total + kl_coef * kl_sum
        metrics["kl_ref"] = jax.lax.stop_gradient(kl_sum)
    aux = jnp.asarray(out.aux_loss if out.aux_loss is not None else 0.0, jnp.float32)
    metrics["aux_loss"] = aux * n
    return LossOutput(total=total + aux_loss_coef * aux * n, weight=n, metrics=metrics)


def derived(metrics: Mapping[str, float]) -> dict[str, float]:
    """Host-side figures of a step: the sampler-vs-recomputed log-prob mismatch (mean |Δ|
    over the first minibatch's sampled tokens; absent on later minibatches)."""
    if metrics.get("fresh_tokens"):
        return {"logprob_mismatch": metrics["mismatch_sum"] / metrics["fresh_tokens"]}
    return {}
