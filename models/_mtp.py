"""The MTP (NextN) draft head of Qwen3.5/3.6-MoE, in SGLang's convention.

For position t the head sees the target's hidden state h_t (after the target's final norm)
and the embedding of the token at t + 1, and predicts the token at t + 2:

    x_t = fc(concat([norm_e(embed(tok_{t+1})), norm_h(h_t)]))     embedding first
    y_t = DecoderLayer(x)_t                                       full attention + MoE, causal
    draft_logits_t = lm_head(norm(y_t))

The embedding and LM head are the target's (shared, never copied); the head owns `fc`, the
two input norms, one full-attention MoE decoder layer and its final norm — the 19 `mtp.*`
tensors of the official checkpoints (`serve.convert` maps them). The layer attends over the
head's own inputs at earlier positions, so decoding keeps a KV cache for it (`init_cache`);
pair t takes RoPE position t (the target's position of h_t), as SGLang's draft extend does.
For chained drafts the head's own normed output hidden state stands in for h of the next
position.

The head is a module of its own rather than part of `Qwen`: the policy trains and checkpoints
without it, and a head taken from a base checkpoint is grafted onto a trained policy by
calling it with that policy (see `rl` for the adaptation stage).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from models import _cache
from models import _params as P
from models._cache import Cache
from models._config import QwenConfig
from models._model import DecoderLayer, Qwen
from models._norms import RMSNorm
from models._positions import rope_angles, segments_from_ids


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTPOutput:
    """What `MTPHead.__call__` returns.

    Attributes:
        logits: [B, T, V] draft logits for the token two ahead of each position.
        hidden: [B, T, H] the head's output after its final norm (h for a chained draft).
        aux_loss: f32[] load-balancing loss of the head's MoE layer (unscaled).
        cache: the updated `Cache` of a cached call, else None.
    """

    logits: jax.Array
    hidden: jax.Array
    aux_loss: jax.Array
    cache: Cache | None = None


def check_mtp_config(config: QwenConfig) -> None:
    """Raises ValueError unless `config` describes a model with one Qwen3.5 MTP layer."""
    if not config.is_qwen3_5:
        raise ValueError(
            f"MTPHead: family {config.family!r} has no MTP head (only qwen3_5_moe has one)"
        )
    if config.mtp_num_hidden_layers not in (0, 1):
        raise ValueError(
            f"MTPHead: mtp_num_hidden_layers={config.mtp_num_hidden_layers}; only one MTP "
            "layer (the Qwen3.5/3.6 checkpoints' layout) is supported"
        )


class MTPHead(nnx.Module):
    """One-layer NextN draft head for a `Qwen` of the same config.

    Call: `head(hidden, next_input_ids, target, *, positions=None, segment_ids=None,
    cache=None) -> MTPOutput`, with `hidden` [B, T, H] the target's `QwenOutput.hidden`,
    `next_input_ids` int[B, T] the token after each position, and `target` the `Qwen` whose
    embedding and LM head are shared. Without a cache, `segment_ids`/`positions` follow the
    target's packing conventions; with one, as in a cached `Qwen` call.
    """

    def __init__(self, config: QwenConfig, *, rngs: nnx.Rngs):
        check_mtp_config(config)
        c = config.resolved()  # "auto" runtime values made concrete for this backend
        self.config = c
        pd = P.to_dtype(c.param_dtype)
        norm = dict(eps=c.rms_norm_eps, offset=c.norm_offset, param_dtype=pd)
        # fc is stored input-first: rows 0..H-1 read the embedding, H..2H-1 the hidden state.
        self.fc = P.normal(
            (2 * c.hidden_size, c.hidden_size), (None, P.EMBED), std=c.initializer_range, dtype=pd
        )
        self.pre_fc_norm_embedding = RMSNorm(c.hidden_size, P.EMBED, **norm)
        self.pre_fc_norm_hidden = RMSNorm(c.hidden_size, P.EMBED, **norm)
        self.layer = DecoderLayer(c, "full_attention")
        self.norm = RMSNorm(c.hidden_size, P.EMBED, **norm)
        P.initialize(self, rngs.params())

    def init_cache(self, batch: int, max_length: int) -> Cache:
        """An empty cache for the head's attention layer (`max_length` pairs per row)."""
        layer = _cache.init_layer_cache(
            self.config, "full_attention", repeats=1, batch=batch, max_length=max_length
        )
        return Cache(end=jnp.zeros((batch,), jnp.int32), layers=(layer,), empty=True)

    def _inputs(self, hidden, next_input_ids, target: Qwen) -> jax.Array:
        dtype = P.to_dtype(self.config.dtype)
        e = self.pre_fc_norm_embedding(target.embed[...][next_input_ids].astype(dtype))
        h = self.pre_fc_norm_hidden(hidden.astype(dtype))
        return jnp.concatenate([e, h], axis=-1) @ self.fc[...].astype(dtype)

    def _finish(self, y, counts, prob_sums, valid, target: Qwen):
        hidden = self.norm(y)
        c = self.config
        rows = jnp.maximum(jnp.sum(valid), 1).astype(jnp.float32)
        aux = c.num_experts * jnp.sum((counts / rows) * (prob_sums / rows))
        return hidden, target._unembed(hidden), aux

    def __call__(
        self,
        hidden: jax.Array,
        next_input_ids: jax.Array,
        target: Qwen,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache: Cache | None = None,
    ) -> MTPOutput:
        if hidden.shape[:2] != next_input_ids.shape:
            raise ValueError(
                f"MTPHead: hidden {hidden.shape} and next_input_ids {next_input_ids.shape} "
                "must share [B, T]"
            )
        if cache is not None:
            return self._cached(hidden, next_input_ids, target, positions, segment_ids, cache)
        segments = segments_from_ids(next_input_ids, segment_ids, positions)
        rope = rope_angles(segments.positions, self.config.rotary_dim, self.config.rope_theta)
        x = self._inputs(hidden, next_input_ids, target)
        y, counts, prob_sums, _ = self.layer(x, segments, rope)
        out_hidden, logits, aux = self._finish(y, counts, prob_sums, segments.valid, target)
        return MTPOutput(logits=logits, hidden=out_hidden, aux_loss=aux)

    def _cached(self, hidden, next_input_ids, target, positions, segment_ids, cache: Cache):
        fill, lead, segments, next_input_ids, (hidden,) = _cache.prepare_call(
            cache, next_input_ids, segment_ids, positions, hidden
        )
        rope = rope_angles(segments.positions, self.config.rotary_dim, self.config.rope_theta)
        x = self._inputs(hidden, next_input_ids, target)
        layer_cache = jax.tree.map(lambda a: a[0], cache.layers[0])
        y, counts, prob_sums, layer_cache = self.layer(x, segments, rope, layer_cache, fill)
        out_hidden, logits, aux = self._finish(y, counts, prob_sums, fill.valid, target)
        out_hidden, logits = _cache.restore_outputs(lead, out_hidden, logits)
        new_cache = Cache(
            end=fill.start + fill.count, layers=(jax.tree.map(lambda a: a[None], layer_cache),)
        )
        return MTPOutput(logits=logits, hidden=out_hidden, aux_loss=aux, cache=new_cache)
