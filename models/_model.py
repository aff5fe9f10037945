"""The Qwen MoE decoder: embedding, scanned blocks of decoder layers, final norm, LM head.

Layers are grouped by the repeating unit of `layer_types` (3 DeltaNet + 1 attention for
Qwen3.5, a single attention layer for Qwen3-MoE). One `Block` holds one repeat; its
parameters are stacked over repeats (leading `layers` axis) and the forward pass is one
`jax.lax.scan` over the stack, so compile time does not grow with depth. The scan body is
rematerialised according to `config.remat`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import _params as P
from models._attention import Attention
from models._config import QwenConfig
from models._deltanet import GatedDeltaNet
from models._moe import MoE
from models._norms import RMSNorm
from models._positions import Segments, rope_angles, segments_from_ids

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_saveable,
    "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QwenOutput:
    """What `Qwen.__call__` returns.

    Attributes:
        logits: [B, T, V] next-token logits (config dtype).
        hidden: [B, T, H] hidden states after the final norm (the MTP head's input).
        aux_loss: f32[] load-balancing loss as transformers defines it (unscaled; multiply
            by `config.router_aux_loss_coef`), over non-padding tokens of all layers.
        cache: decoding state; None until cached decoding lands.
    """

    logits: jax.Array
    hidden: jax.Array
    aux_loss: jax.Array
    cache: Any = None


class DecoderLayer(nnx.Module):
    """Pre-norm residual layer: token mixer (attention or DeltaNet), then MoE."""

    def __init__(self, config: QwenConfig, kind: str):
        c = config
        self.kind = kind
        norm = dict(eps=c.rms_norm_eps, offset=c.norm_offset, param_dtype=P.to_dtype(c.param_dtype))
        self.input_norm = RMSNorm(c.hidden_size, P.EMBED, **norm)
        if kind == "full_attention":
            self.mixer = Attention(c)
        else:
            self.mixer = GatedDeltaNet(c)
        self.post_norm = RMSNorm(c.hidden_size, P.EMBED, **norm)
        self.moe = MoE(c)

    def __call__(self, x, segments: Segments, rope):
        h, _ = self.mixer(self.input_norm(x), segments, rope)
        x = x + h
        h, counts, prob_sums = self.moe(self.post_norm(x), segments.valid)
        return x + h, counts, prob_sums


class Block(nnx.Module):
    """One repeat of the layer pattern."""

    def __init__(self, config: QwenConfig):
        self.layers = nnx.List([DecoderLayer(config, k) for k in config.block_pattern])

    def __call__(self, x, segments: Segments, rope):
        counts = prob_sums = 0.0
        for layer in self.layers:
            x, c, p = layer(x, segments, rope)
            counts, prob_sums = counts + c, prob_sums + p
        return x, counts, prob_sums


class Qwen(nnx.Module):
    """Qwen3.5/3.6-MoE or Qwen3-MoE causal LM.

    Call: `model(input_ids, *, positions=None, segment_ids=None, cache=None) -> QwenOutput`
    with `input_ids` int[B, T]; `segment_ids` int[B, T] packs several documents per row
    (0 = padding; see `models._positions`); `positions` default to per-segment positions.
    """

    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        pd = P.to_dtype(c.param_dtype)
        self.embed = P.normal(
            (c.vocab_size, c.hidden_size), (P.VOCAB, P.EMBED), std=c.initializer_range, dtype=pd
        )

        @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: P.LAYERS})
        def make_blocks(_):
            return Block(c)

        self.blocks = make_blocks(jnp.arange(c.num_blocks))
        self.final_norm = RMSNorm(
            c.hidden_size, P.EMBED, eps=c.rms_norm_eps, offset=c.norm_offset, param_dtype=pd
        )
        if not c.tie_word_embeddings:
            self.lm_head = P.normal(
                (c.hidden_size, c.vocab_size), (P.EMBED, P.VOCAB), std=c.initializer_range, dtype=pd
            )
        P.initialize(self, rngs.params())

    def _run_blocks(self, x: jax.Array, segments: Segments, rope):
        graphdef, state = nnx.split(self.blocks)

        def body(carry, block_state):
            h, counts, prob_sums = carry
            block = nnx.merge(graphdef, block_state)
            h, c, p = block(h, segments, rope)
            return (h, counts + c, prob_sums + p), None

        policy = self.config.remat
        if policy != "none":
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[policy], prevent_cse=False)
        zeros = jnp.zeros((self.config.num_experts,), jnp.float32)
        unroll = min(self.config.scan_unroll, self.config.num_blocks)
        (x, counts, prob_sums), _ = jax.lax.scan(body, (x, zeros, zeros), state, unroll=unroll)
        return x, counts, prob_sums

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: Any = None,
    ) -> QwenOutput:
        if cache is not None:
            raise NotImplementedError(
                "Qwen: cached decoding is not implemented yet; pass cache=None"
            )
        c = self.config
        dtype = P.to_dtype(c.dtype)
        segments = segments_from_ids(input_ids, segment_ids, positions)
        rope = rope_angles(segments.positions, c.rotary_dim, c.rope_theta)
        x = self.embed[...][input_ids].astype(dtype)
        x, counts, prob_sums = self._run_blocks(x, segments, rope)
        hidden = self.final_norm(x)
        head = self.embed[...].T if c.tie_word_embeddings else self.lm_head[...]
        logits = hidden @ head.astype(dtype)
        rows = jnp.maximum(jnp.sum(segments.valid), 1).astype(jnp.float32) * c.num_layers
        aux = c.num_experts * jnp.sum((counts / rows) * (prob_sums / rows))
        return QwenOutput(logits=logits, hidden=hidden, aux_loss=aux, cache=None)
