"""The SFT loss: masked next-token cross-entropy plus the MoE load-balancing loss.

Batches are packed rows (see `hat_jax.train.DataSource`): `input_ids`, `loss_mask` (1 on
tokens the assistant produced, i.e. the tokens to learn), `segment_ids` (0 = padding) and
per-segment `positions`. Position t predicts token t + 1; it is a target iff token t + 1 has
`loss_mask` 1 and belongs to the same (non-padding) segment as token t.

The objective is token-weighted over the whole batch:
`sum(ce * w) / sum(w) + aux_coef * aux`, where `aux` is the model's auxiliary loss averaged
over micro-batches weighted by their target tokens (with one micro-batch it is simply the
model's `aux_loss`).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

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


def sft_loss(
    model: nnx.Module,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    aux_loss_coef: float = 0.0,
) -> LossOutput:
    """Masked next-token cross-entropy plus `aux_loss_coef` x the model's MoE aux loss.

    Returns sums (see `LossOutput`): total = sum(ce) + coef * aux * tokens, weight = tokens;
    metrics `ce`, `aux_loss`, `accuracy` (each reported per target token).
    """
    del rng
    out = model(batch["input_ids"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    targets, weights = next_token_targets(batch)
    weights = weights.astype(jnp.float32)
    logits = out.logits[:, :-1]
    ce_sum = jnp.sum(cross_entropy(logits, targets) * weights)
    tokens = jnp.sum(weights)
    aux = jnp.asarray(out.aux_loss if out.aux_loss is not None else 0.0, jnp.float32)
    correct = jnp.sum((jnp.argmax(logits, -1) == targets) * weights)
    return LossOutput(
        total=ce_sum + aux_loss_coef * aux * tokens,
        weight=tokens,
        metrics={"ce": ce_sum, "aux_loss": aux * tokens, "accuracy": correct},
    )
