"""The draft head's math: labels, cross-entropy and speculative-decoding acceptance.

MTP adaptation (paper App. H, DeepSeek-V3 style). The policy is frozen; its NextN draft head
sees the hidden state at position t and the embedding of token t+1 and predicts token t+2.
`mtp_targets` aligns those labels (respecting packing segments), `mtp_loss` is the masked
cross-entropy on sequences from policy rollouts, and `acceptance_probability` /
`acceptance_length` estimate what speculative decoding would accept.

All logits are upcast to f32. Every function is wrapped in ``jax.jit`` (mode strings, offsets
and counts static) and nests inside a caller's jitted step. Loss aggregation follows
`rl.losses.aggregate_loss`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rl.losses import aggregate_loss, check_mask, logits_pair

_sg = jax.lax.stop_gradient


@functools.partial(jax.jit, static_argnames="offset")
def mtp_targets(input_ids, loss_mask, *, offset=2, segment_ids=None):
    """Labels for a draft head that predicts ``offset`` tokens ahead.

    ``targets[:, t] = input_ids[:, t + offset]`` and the mask is the target token's loss mask
    (so only policy-generated tokens are predicted), zero for the last ``offset`` positions and
    wherever position t and its target lie in different packed segments.

    Args:
      input_ids: i32[N, T] token ids.
      loss_mask: f32[N, T] 1 on policy-generated tokens.
      offset: how far ahead the head predicts (2 for the first NextN/MTP depth).
      segment_ids: optional i32[N, T] packing segments.

    Returns:
      ``(targets i32[N, T], mask f32[N, T])``.
    """
    ids = jnp.asarray(input_ids)
    n, t = ids.shape
    if offset < 1:
        raise ValueError(f"mtp offset must be >= 1, got {offset}")
    lm = check_mask(loss_mask, ids.shape)

    def shift(x, fill):
        pad = jnp.full((n, min(offset, t)), fill, x.dtype)
        return jnp.concatenate([x[:, offset:], pad], axis=1)

    targets, mask = shift(ids, 0), shift(lm, 0.0)
    if segment_ids is not None:
        seg = jnp.asarray(segment_ids)
        mask = mask * (shift(seg, -1) == seg)
    return targets, mask


@functools.partial(jax.jit, static_argnames="aggregation")
def mtp_loss(draft_logits, targets, mask, *, aggregation="token-mean"):
    """Masked cross-entropy of the MTP draft head (no reward, no advantage).

    Args:
      draft_logits: f32[N, T, V] draft-head logits at position t.
      targets: i32[N, T] aligned labels (see `mtp_targets`); masked entries may be anything.
      mask: f32[N, T] 1 where the label counts.
      aggregation: one of `rl.losses.AGGREGATIONS`.

    Returns:
      ``(loss f32[], metrics)`` with ``mtp_ce`` (= loss), ``mtp_top1`` (share of counted
      positions whose argmax is the label) and ``mtp_tokens`` (number of counted positions).
    """
    logits = jnp.asarray(draft_logits, jnp.float32)
    targets = jnp.asarray(targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {logits.shape[:-1]}, got {targets.shape}")
    mask = check_mask(mask, targets.shape)
    safe = jnp.clip(jnp.where(mask > 0, targets, 0), 0, logits.shape[-1] - 1)
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    loss = aggregate_loss(ce, mask, aggregation)
    hit = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32)
    metrics = {
        "mtp_ce": _sg(loss),
        "mtp_top1": aggregate_loss(hit, mask),
        "mtp_tokens": jnp.sum(mask),
    }
    return loss, metrics


@functools.partial(jax.jit, static_argnames="temperature")
def acceptance_probability(draft_logits, target_logits, *, temperature=1.0) -> jax.Array:
    """Per-position speculative-sampling acceptance ``α = Σ_v min(p(v), q(v))``.

    p is the target (policy) distribution and q the draft distribution for the *same* next
    token, both at ``temperature``. Under speculative sampling (Leviathan et al., 2023) a draft
    token y ~ q is accepted with probability min(1, p(y)/q(y)); averaged over y ~ q that is
    exactly Σ_v min(p, q) = 1 − TV(p, q). Alignment is the caller's: for the first MTP depth,
    draft logits at position t pair with the policy's logits at position t + 1.

    Args:
      draft_logits: f32[..., V].
      target_logits: f32[..., V].
      temperature: sampling temperature (> 0) applied to both.

    Returns:
      f32[...] acceptance probabilities in [0, 1].
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    q, p = logits_pair(draft_logits, target_logits)
    q = jax.nn.softmax(q / temperature, axis=-1)
    p = jax.nn.softmax(p / temperature, axis=-1)
    return jnp.clip(jnp.sum(jnp.minimum(p, q), axis=-1), 0.0, 1.0)


@functools.partial(jax.jit, static_argnames="num_draft_tokens")
def acceptance_length(accept_prob, mask, *, num_draft_tokens: int) -> jax.Array:
    """Simulated mean acceptance length with ``k = num_draft_tokens`` drafts per step.

    Definition. Decoding starts a verification step at position t; the drafter proposes k
    tokens for positions t, …, t+k−1, accepted one after another with probabilities
    α_t, …, α_{t+k−1} until the first rejection; the verifier then emits one more token of its
    own (the correction or bonus token). The expected number of tokens emitted by the step is

        E_t = 1 + Σ_{j=1..k} Π_{i=0..j−1} α_{t+i},

    with α = 0 at masked positions and past the end of the row (a chain never crosses them).
    The result is the mean of E_t over the unmasked start positions t — the quantity SGLang
    reports as the average acceptance length, in [1, k+1]. It is an estimate from teacher-forced
    per-position α (for chained drafts the head would condition on its own earlier drafts);
    with 0/1 α (greedy match of the draft's argmax) it is the greedy run length.

    Args:
      accept_prob: f32[N, T] per-position acceptance α (e.g. `acceptance_probability`).
      mask: f32[N, T] 1 on positions that count.
      num_draft_tokens: k >= 1, the draft tokens proposed per step.

    Returns:
      f32[] mean acceptance length (1.0 for an empty mask).
    """
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    alpha = jnp.asarray(accept_prob, jnp.float32)
    mask = check_mask(mask, alpha.shape)
    alpha = jnp.where(mask > 0, alpha, 0.0)
    n, t = alpha.shape
    padded = jnp.concatenate([alpha, jnp.zeros((n, num_draft_tokens), alpha.dtype)], axis=1)
    run = jnp.ones_like(alpha)
    expected = jnp.ones_like(alpha)
    for j in range(num_draft_tokens):
        run = run * padded[:, j : j + t]
        expected = expected + run
    return jnp.where(jnp.sum(mask) > 0, aggregate_loss(expected, mask), 1.0)
