"""The Qwen MoE decoder: embedding, scanned blocks of decoder layers, final norm, LM head.

Layers are grouped by the repeating unit of `layer_types` (3 DeltaNet + 1 attention for
Qwen3.5, a single attention layer for Qwen3-MoE). One `Block` holds one repeat; its
parameters are stacked over repeats (leading `layers` axis) and the forward pass is one
`jax.lax.scan` over the stack, so compile time does not grow with depth. The scan body is
rematerialised according to `config.remat`.

With a `Cache` (`models._cache`; `model.init_cache(batch, max_length)`), the call continues
each row of the cache: the caches of all layers are scanned together with the parameters,
valid tokens are moved to the front of their row first (so left- and right-padded prompts
fill consecutive slots) and the outputs moved back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import _cache
from models import _params as P
from models._attention import Attention
from models._cache import Cache, Fill
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
        cache: the updated `Cache` of a cached call, else None.
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

    def __call__(self, x, segments: Segments, rope, cache=None, fill: Fill | None = None):
        h, cache = self.mixer(self.input_norm(x), segments, rope, cache, fill)
        x = x + h
        h, counts, prob_sums = self.moe(self.post_norm(x), segments.valid)
        return x + h, counts, prob_sums, cache


@nnx.remat
def _remat_layer(layer, x, segments, rope):
    return layer(x, segments, rope)


class Block(nnx.Module):
    """One repeat of the layer pattern."""

    def __init__(self, config: QwenConfig):
        self.layers = nnx.List([DecoderLayer(config, k) for k in config.block_pattern])
        self.remat_layers = config.remat_per_layer

    def __call__(self, x, segments: Segments, rope, caches=None, fill: Fill | None = None):
        counts = prob_sums = 0.0
        new_caches = []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            if self.remat_layers and caches is None:  # nested checkpoint: one layer at a time
                x, c, p, cache = _remat_layer(layer, x, segments, rope)
                new_caches.append(cache)
                counts, prob_sums = counts + c, prob_sums + p
                continue
            x, c, p, cache = layer(x, segments, rope, cache, fill)
            counts, prob_sums = counts + c, prob_sums + p
            new_caches.append(cache)
        return x, counts, prob_sums, (None if caches is None else tuple(new_caches))


class Qwen(nnx.Module):
    """Qwen3.5/3.6-MoE or Qwen3-MoE causal LM.

    Call: `model(input_ids, *, positions=None, segment_ids=None, cache=None) -> QwenOutput`
    with `input_ids` int[B, T]; `segment_ids` int[B, T] packs several documents per row
    (0 = padding; see `models._positions`); `positions` default to per-segment positions.
    """

    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs):
        c = config.resolved()  # "auto" runtime values made concrete for this backend
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

    def _run_blocks(self, x: jax.Array, segments: Segments, rope, caches=None, fill=None):
        graphdef, state = nnx.split(self.blocks)

        def body(carry, xs):
            h, counts, prob_sums = carry
            block_state, block_caches = xs
            block = nnx.merge(graphdef, block_state)
            h, c, p, block_caches = block(h, segments, rope, block_caches, fill)
            return (h, counts + c, prob_sums + p), block_caches

        policy = self.config.remat
        if policy != "none" and caches is None:
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[policy], prevent_cse=False)
        zeros = jnp.zeros((self.config.num_experts,), jnp.float32)
        unroll = min(self.config.scan_unroll, self.config.num_blocks)
        (x, counts, prob_sums), caches = jax.lax.scan(
            body, (x, zeros, zeros), (state, caches), unroll=unroll
        )
        return x, counts, prob_sums, caches

    def init_cache(self, batch: int, max_length: int, *, rollback: int = 0) -> Cache:
        """An empty decoding cache (see `models._cache.init_cache`)."""
        return _cache.init_cache(self.config, batch, max_length, rollback=rollback)

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: Cache | None = None,
    ) -> QwenOutput:
        if cache is not None:
            return self._cached(input_ids, positions, segment_ids, cache)
        segments = segments_from_ids(input_ids, segment_ids, positions)
        x, counts, prob_sums, _ = self._run_blocks(
            self._embed(input_ids), segments, self._rope(segments)
        )
        hidden = self.final_norm(x)
        return QwenOutput(
            logits=self._unembed(hidden),
            hidden=hidden,
            aux_loss=self._aux_loss(counts, prob_sums, segments.valid),
            cache=None,
        )

    def _embed(self, input_ids: jax.Array) -> jax.Array:
        return self.embed[...][input_ids].astype(P.to_dtype(self.config.dtype))

    def _rope(self, segments: Segments):
        return rope_angles(segments.positions, self.config.rotary_dim, self.config.rope_theta)

    def _unembed(self, hidden: jax.Array) -> jax.Array:
        c = self.config
        head = self.embed[...].T if c.tie_word_embeddings else self.lm_head[...]
        # Tokens flattened to rows: a plain 2-D matmul (XLA's CPU 3-D form is slower).
        logits = hidden.reshape(-1, hidden.shape[-1]) @ head.astype(hidden.dtype)
        return logits.reshape(*hidden.shape[:-1], -1)

    def _aux_loss(self, counts, prob_sums, valid) -> jax.Array:
        c = self.config
        rows = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32) * c.num_layers
        return c.num_experts * jnp.sum((counts / rows) * (prob_sums / rows))

    def _cached(self, input_ids, positions, segment_ids, cache: Cache) -> QwenOutput:
        """A call that continues the rows of `cache` (see `models._cache`)."""
        if not isinstance(cache, Cache):
            raise TypeError(
                f"cache must be a models.Cache (from model.init_cache), got {type(cache).__name__}"
            )
        if len(cache.layers) != len(self.config.block_pattern):
            raise ValueError(
                f"cache has {len(cache.layers)} layer entries, the model's layer pattern "
                f"{len(self.config.block_pattern)}: build it with model.init_cache"
            )
        fill, lead, segments, input_ids, _ = _cache.prepare_call(
            cache, input_ids, segment_ids, positions
        )
        x, counts, prob_sums, layers = self._run_blocks(
            self._embed(input_ids), segments, self._rope(segments), cache.layers, fill
        )
        hidden = self.final_norm(x)
        logits = self._unembed(hidden)
        hidden, logits = _cache.restore_outputs(lead, hidden, logits)
        return QwenOutput(
            logits=logits,
            hidden=hidden,
            aux_loss=self._aux_loss(counts, prob_sums, fill.valid),
            cache=Cache(end=fill.start + fill.count, layers=layers),
        )
