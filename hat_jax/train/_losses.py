"""The SFT loss: masked next-token cross-entropy plus the MoE load-balancing loss.

Batches are packed rows (see `hat_jax.train.DataSource`): `input_ids`, `loss_mask` (1 on
tokens the assistant produced, i.e. the tokens to learn), `segment_ids` (0 = padding) and
per-segment `positions`. Position t predicts token t + 1; it is a target iff token t + 1 has
`loss_mask` 1 and belongs to the same (non-padding) segment as token t.

The objective is token-weighted over the whole batch:
`sum(ce * w) / sum(w) + aux_coef * aux`, where `aux` is the model's auxiliary loss averaged
over micro-batches weighted by their target tokens (with one micro-batch it is simply the
model's `aux_loss`).

With `logits_chunk`, the cross-entropy is computed from the model's final hidden states a
chunk of positions at a time, each chunk's logits recomputed in the backward pass, so the
`[B, T, V]` logits (8 GB per 8K-token row at Qwen's 248K vocabulary, in float32) never exist
at once; the model's own `.logits` are then unused and compiled away.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from hat_jax.sharding import constrain
from hat_jax.train._step import LossOutput


def next_token_targets(batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """`(targets, weights)`, both `[B, T-1]`: the next token and whether it is a target."""
    ids, mask, seg = batch["input_ids"], batch["loss_mask"], batch["segment_ids"]
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    return ids[:, 1:], (mask[:, 1:] > 0) & same


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-position cross-entropy in float32. logits: f[..., V]; targets: i[...] -> f32[...]."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - picked


def unembedding(model: nnx.Module) -> jax.Array:
    """The `[H, V]` matrix a model's logits come from (`lm_head`, or the tied embedding),
    in the model's compute dtype."""
    config = getattr(model, "config", None)
    if hasattr(model, "lm_head"):
        head = model.lm_head[...]
    elif hasattr(model, "embed") and getattr(config, "tie_word_embeddings", False):
        head = model.embed[...].T
    else:
        raise ValueError(
            f"logits_chunk needs a model with an `lm_head` parameter (or a tied `embed`); "
            f"{type(model).__name__} has neither"
        )
    return head.astype(jnp.dtype(getattr(config, "dtype", head.dtype)))


def _chunks(x: jax.Array, chunk: int) -> jax.Array:
    """`[B, T, ...]` -> `[n, B, chunk, ...]` (T zero-padded up to n x chunk)."""
    b, t = x.shape[:2]
    n = -(-t // chunk)
    x = jnp.pad(x, ((0, 0), (0, n * chunk - t)) + ((0, 0),) * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)


def chunked_cross_entropy(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, weights: jax.Array, *, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """`(sum(ce * w), sum(correct * w))` from hidden states, `chunk` positions at a time.

    hidden: f[B, T, H]; head: f[H, V]; targets: i[B, T]; weights: f32[B, T].
    """

    @jax.checkpoint
    def body(carry, xs):
        h, tgt, w = xs
        logits = constrain(h.astype(head.dtype) @ head, ("batch", "seq", "vocab"))
        ce = jnp.sum(cross_entropy(logits, tgt) * w)
        correct = jnp.sum((jnp.argmax(logits, -1) == tgt) * w)
        return (carry[0] + ce, carry[1] + correct), None

    zero = jnp.zeros((), jnp.float32)
    xs = (_chunks(hidden, chunk), _chunks(targets, chunk), _chunks(weights, chunk))
    (ce_sum, correct), _ = jax.lax.scan(body, (zero, zero), xs)
    return ce_sum, correct


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """f32[...] the log-probability of each target under `logits` f[..., V] (float32)."""
    return -cross_entropy(logits, targets)


def chunked_token_logprobs(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, *, chunk: int
) -> jax.Array:
    """`token_logprobs(hidden @ head, targets)`, f32[B, T], `chunk` positions at a time, each
    chunk's logits recomputed in the backward pass (the `[B, T, V]` logits never exist).

    hidden: f[B, T, H]; head: f[H, V]; targets: i[B, T].
    """
    t = hidden.shape[1]

    @jax.checkpoint
    def body(_, xs):
        h, tgt = xs
        logits = constrain(h.astype(head.dtype) @ head, ("batch", "seq", "vocab"))
        return None, token_logprobs(logits, tgt)

    _, logp = jax.lax.scan(body, None, (_chunks(hidden, chunk), _chunks(targets, chunk)))
    n, b = logp.shape[:2]
    return jnp.moveaxis(logp, 0, 1).reshape(b, n * chunk)[:, :t]


def model_token_logprobs(
    model: nnx.Module, out, targets: jax.Array, *, logits_chunk: int = 0
) -> jax.Array:
    """f32[B, T-1] the log-probability of each next token (`targets`, `[B, T-1]`) under a
    model's output `out` (its `.logits`, or with `logits_chunk` > 0 its `.hidden` and
    `unembedding(model)`, a chunk of positions at a time)."""
    if logits_chunk > 0:
        hidden = constrain(out.hidden, ("batch", "seq", "embed"))[:, :-1]
        return chunked_token_logprobs(hidden, unembedding(model), targets, chunk=logits_chunk)
    logits = constrain(out.logits, ("batch", "seq", "vocab"))[:, :-1]
    return token_logprobs(logits, targets)


def sft_loss(
    model: nnx.Module,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    aux_loss_coef: float = 0.0,
    logits_chunk: int = 0,
) -> LossOutput:
    """Masked next-token cross-entropy plus `aux_loss_coef` x the model's MoE aux loss.

    Args:
      model: called as `model(input_ids, positions=, segment_ids=)`; its output has
        `.logits`, `.hidden` and `.aux_loss`.
      batch: packed rows (`input_ids`, `loss_mask`, `segment_ids`, `positions`).
      rng: unused (SFT is deterministic); part of the loss-function contract.
      aux_loss_coef: weight of the auxiliary loss.
      logits_chunk: > 0 computes the cross-entropy this many positions at a time from
        `.hidden` and `unembedding(model)` (see the module docstring).

    Returns sums (see `LossOutput`): total = sum(ce) + coef * aux * tokens, weight = tokens;
    metrics `ce`, `aux_loss`, `accuracy` (each reported per target token).
    """
    del rng
    out = model(batch["input_ids"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    targets, weights = next_token_targets(batch)
    weights = weights.astype(jnp.float32)
    tokens = jnp.sum(weights)
    if logits_chunk > 0:
        hidden = constrain(out.hidden, ("batch", "seq", "embed"))[:, :-1]
        ce_sum, correct = chunked_cross_entropy(
            hidden, unembedding(model), targets, weights, chunk=logits_chunk
        )
    else:
        logits = constrain(out.logits, ("batch", "seq", "vocab"))[:, :-1]
        ce_sum = jnp.sum(cross_entropy(logits, targets) * weights)
        correct = jnp.sum((jnp.argmax(logits, -1) == targets) * weights)
    aux = jnp.asarray(out.aux_loss if out.aux_loss is not None else 0.0, jnp.float32)
    return LossOutput(
        total=ce_sum + aux_loss_coef * aux * tokens,
        weight=tokens,
        metrics={"ce": ce_sum, "aux_loss": aux * tokens, "accuracy": correct},
    )
