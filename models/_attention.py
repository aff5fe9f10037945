"""Grouped-query attention with QK-norm, partial RoPE and (Qwen3.5) a sigmoid output gate.

Qwen3.5's `q_proj` emits, per head, head_dim query rows followed by head_dim gate rows;
the output is `o_proj(attn * sigmoid(gate))`. Qwen3-MoE has no gate. QK-norm is an RMSNorm
over head_dim applied before RoPE. The mask is block-diagonal causal over segments.

The score function takes key/value slots and their segment indices explicitly. With a KV
cache (`models._cache`), a call writes its keys and values into the row's next slots and
attends over every slot; the causal mask on slots hides the empty ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import _params as P
from models._cache import AttentionCache, Fill
from models._config import QwenConfig
from models._flash import flash_attention
from models._norms import RMSNorm
from models._positions import Segments, apply_rope


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_slot: jax.Array,
    k_slot: jax.Array,
    q_doc: jax.Array,
    k_doc: jax.Array,
) -> jax.Array:
    """Masked softmax attention with grouped KV heads.

    Args:
        q: [B, T, H, D] queries (scaled here by D^-0.5).
        k, v: [B, S, KV, D] keys and values; H is a multiple of KV.
        q_slot, k_slot: int[B, T] / int[B, S] sequence indices (causality: k_slot <= q_slot).
        q_doc, k_doc: int[B, T] / int[B, S] segment indices (attend only within a segment).

    Returns:
        [B, T, H, D] in q's dtype; softmax in float32.
    """
    batch, length, heads, dim = q.shape
    kv_heads, size = k.shape[2], k.shape[1]
    group = heads // kv_heads
    # [B, KV, G T, D] against [B, KV, S, D]: plain batched matmuls (forward and backward)
    # with the query heads of a KV head stacked as rows.
    q = jnp.moveaxis(q.reshape(batch, length, kv_heads, group, dim), 1, 3)
    q = q.reshape(batch, kv_heads, group * length, dim)
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, kv_heads, group, length, size) * (dim**-0.5)
    mask = (k_slot[:, None, :] <= q_slot[:, :, None]) & (k_doc[:, None, :] == q_doc[:, :, None])
    scores = jnp.where(mask[:, None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs.reshape(batch, kv_heads, group * length, size), v)
    out = jnp.moveaxis(out.reshape(batch, kv_heads, group, length, dim), 3, 1)
    return out.reshape(batch, length, heads, dim)


class Attention(nnx.Module):
    """The full-attention token mixer of one layer."""

    def __init__(self, config: QwenConfig):
        c = config
        self.config = c
        pd = P.to_dtype(c.param_dtype)
        std = c.initializer_range
        e, h, kv, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = P.normal((e, h, d), (P.EMBED, P.Q_HEADS, P.HEAD_DIM), std=std, dtype=pd)
        if c.attn_output_gate:
            self.gate_proj = P.normal(
                (e, h, d), (P.EMBED, P.Q_HEADS, P.HEAD_DIM), std=std, dtype=pd
            )
        self.k_proj = P.normal((e, kv, d), (P.EMBED, P.KV_HEADS, P.HEAD_DIM), std=std, dtype=pd)
        self.v_proj = P.normal((e, kv, d), (P.EMBED, P.KV_HEADS, P.HEAD_DIM), std=std, dtype=pd)
        self.o_proj = P.normal((h, d, e), (P.Q_HEADS, P.HEAD_DIM, P.EMBED), std=std, dtype=pd)
        norm = dict(eps=c.rms_norm_eps, offset=c.norm_offset, param_dtype=pd)
        self.q_norm = RMSNorm(d, P.HEAD_DIM, **norm)
        self.k_norm = RMSNorm(d, P.HEAD_DIM, **norm)

    def _project(self, x: jax.Array) -> tuple[jax.Array, ...]:
        """One fused matmul for q, (gate), k, v."""
        c = self.config
        dt = x.dtype
        kernels = [self.q_proj[...]]
        if c.attn_output_gate:
            kernels.append(self.gate_proj[...])
        kernels += [self.k_proj[...], self.v_proj[...]]
        sizes = [w.shape[1] * w.shape[2] for w in kernels]
        fused = jnp.concatenate([w.reshape(w.shape[0], -1).astype(dt) for w in kernels], axis=1)
        # Tokens flattened to rows: a plain 2-D matmul (XLA's CPU 3-D form is slower).
        y = (x.reshape(-1, x.shape[-1]) @ fused).reshape(*x.shape[:-1], -1)
        parts = jnp.split(y, [sum(sizes[:i]) for i in range(1, len(sizes))], axis=-1)
        shapes = [w.shape[1:] for w in kernels]
        return tuple(p.reshape(*x.shape[:2], *s) for p, s in zip(parts, shapes))

    def __call__(
        self,
        x: jax.Array,
        segments: Segments,
        rope: tuple[jax.Array, jax.Array],
        cache: AttentionCache | None = None,
        fill: Fill | None = None,
    ) -> tuple[jax.Array, AttentionCache | None]:
        """x [B, T, E] -> ([B, T, E], updated cache or None).

        With `cache` (one layer's keys and values, [B, S, KV, D]) and `fill`, the call's
        keys and values go to slots `fill.start + t` and the queries attend over all slots up
        to their own; without, attention is block-diagonal causal over `segments`.
        """
        c = self.config
        parts = self._project(x)
        if c.attn_output_gate:
            q, gate, k, v = parts
        else:
            (q, k, v), gate = parts, None
        q = apply_rope(self.q_norm(q), *rope)
        k = apply_rope(self.k_norm(k), *rope)
        if cache is None and c.attention_impl == "flash" and x.shape[1] > c.attention_block_size:
            out = flash_attention(q, k, v, doc=segments.doc, block_size=c.attention_block_size)
        elif cache is None:
            slots = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
            out = attend(
                q, k, v, q_slot=slots, k_slot=slots, q_doc=segments.doc, k_doc=segments.doc
            )
        else:
            flash = c.attention_impl == "flash" and x.shape[1] > c.attention_block_size
            out, cache = _attend_cached(q, k, v, cache, fill,
                                        flash_block=c.attention_block_size if flash else 0)  # fmt: skip
        if gate is not None:
            out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        batch, length, heads, dim = out.shape
        o_proj = self.o_proj[...].astype(x.dtype).reshape(heads * dim, -1)
        y = (out.reshape(batch * length, heads * dim) @ o_proj).reshape(batch, length, -1)
        return y, cache


def _attend_cached(q, k, v, cache: AttentionCache, fill: Fill, *, flash_block: int = 0):
    """Writes k, v [B, T, KV, D] at slots `fill.start + t` and attends over the cache.

    Into an empty cache (a prefill) with `flash_block` > 0, the call's tokens attend among
    themselves block-wise (`flash_attention`: no [T, T] scores, the same numbers): with
    nothing cached before, that is all the cache would show them. Valid tokens come first in
    each row, so causal order alone keeps them from the trailing padding.
    """
    batch, length = q.shape[:2]
    slots = fill.start[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]
    rows = jnp.arange(batch)[:, None]
    # Out-of-range slots (trailing padding past the end of the cache) are dropped.
    new_k = cache.k.at[rows, slots].set(k.astype(cache.k.dtype), mode="drop")
    new_v = cache.v.at[rows, slots].set(v.astype(cache.v.dtype), mode="drop")
    if fill.empty and flash_block:
        doc = jnp.zeros((batch, length), jnp.int32)
        return flash_attention(q, k, v, doc=doc, block_size=flash_block), AttentionCache(
            k=new_k, v=new_v
        )
    size = new_k.shape[1]
    k_slot = jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (batch, size))
    zeros_q = jnp.zeros((batch, length), jnp.int32)
    zeros_k = jnp.zeros((batch, size), jnp.int32)
    out = attend(
        q, new_k.astype(q.dtype), new_v.astype(q.dtype),
        q_slot=slots, k_slot=k_slot, q_doc=zeros_q, k_doc=zeros_k,
    )  # fmt: skip
    return out, AttentionCache(k=new_k, v=new_v)
