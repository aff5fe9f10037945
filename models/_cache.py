"""Decoding state of a Qwen model: a KV cache for attention layers, conv and recurrent state
for Gated DeltaNet layers, and how a cached call places new tokens.

A `Cache` holds one row per sequence. Row b holds `end[b]` tokens, in slots `0 .. end[b]-1`
of every attention layer's keys and values; the next token goes to slot `end[b]` and gets the
RoPE position `end[b]` (unless the caller gives positions). A cached call with `T` tokens
writes them after the row's tokens and advances `end` by the number of *valid* ones.

Padding in a cached call (`segment_ids == 0`) may lead or trail each row's tokens (left- or
right-padded prompts), but the valid tokens of a row must be contiguous and are one document
that continues the row. The model moves each row's valid tokens to the front before running
(left padding becomes right padding) and moves the outputs back, so a row's tokens always sit
in consecutive slots. Trailing padding is written into slots past the new `end` and never
attended: the causal mask (key slot <= query slot) hides every slot at or after `end` until a
later call overwrites it. In DeltaNet layers padding tokens leave the state unchanged.

DeltaNet layers keep a short history so the last tokens can be taken back (speculative
decoding verifies k drafts in one call, then keeps only the accepted ones): `conv` holds the
last `K - 2 + R` conv inputs and `state` the recurrent states after each of the last `R`
tokens, newest last, where `R = rollback + 1`. `Cache.rewind(n)` drops the newest `n[b]`
tokens of each row (n <= rollback), exactly, provided they were added by calls of at most `R`
tokens (longer calls run the chunked delta rule, which yields only the final state).

Every array carries a leading `layers` axis (the stacked repeats of the layer pattern), like
the parameters, so the model's layer scan slices caches and parameters together.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hat_jax.sharding import constrain
from models import _params as P
from models._config import QwenConfig
from models._positions import Segments


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionCache:
    """Keys and values of one attention layer: `k`, `v` [layers, B, S, KV, D] (compute dtype)."""

    k: jax.Array
    v: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DeltaNetCache:
    """One DeltaNet layer: `conv` [layers, B, K-2+R, C] (the newest conv inputs, newest last)
    and `state` f32[layers, B, R, H, Dk, Dv] (the state after each of the newest R tokens)."""

    conv: jax.Array
    state: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cache:
    """The decoding state of a `Qwen` (or an `MTPHead`).

    Attributes:
        end: int32[B], tokens held per row (the next slot and default position).
        layers: one entry per position of the layer pattern (`AttentionCache` or
            `DeltaNetCache`), each stacked over the pattern's repeats.
        empty: static: True for a cache straight from `init_cache` (nothing held yet), so a
            first call (the prefill) may attend among its own tokens alone, block-wise.
    """

    end: jax.Array
    layers: tuple[AttentionCache | DeltaNetCache, ...]
    empty: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def batch_size(self) -> int:
        return self.end.shape[0]

    @property
    def max_length(self) -> int:
        """Slots per row (0 for a model without attention layers)."""
        for layer in self.layers:
            if isinstance(layer, AttentionCache):
                return layer.k.shape[2]
        return 0

    @property
    def rollback(self) -> int:
        """How many of the newest tokens `rewind` can take back."""
        for layer in self.layers:
            if isinstance(layer, DeltaNetCache):
                return layer.state.shape[2] - 1
        return self.max_length

    def rewind(self, count: jax.Array) -> Cache:
        """Drops the newest `count[b]` tokens of each row (int[B], 0 <= count <= rollback)."""
        count = jnp.asarray(count, jnp.int32)
        layers = tuple(
            _rewind_deltanet(layer, count) if isinstance(layer, DeltaNetCache) else layer
            for layer in self.layers
        )
        return Cache(end=self.end - count, layers=layers)


def _shift_right(x: jax.Array, count: jax.Array, axis: int) -> jax.Array:
    """Per row b (axis 1 of x), out[..., i, ...] = x[..., i - count[b], ...] along `axis`
    (zeros where i - count < 0)."""
    size = x.shape[axis]
    index = jnp.arange(size)[None, :] - count[:, None]  # [B, size]
    shape = [1] * x.ndim
    shape[1], shape[axis] = x.shape[1], size
    index = index.reshape(shape)
    taken = jnp.take_along_axis(x, jnp.maximum(index, 0), axis=axis)
    return jnp.where(index >= 0, taken, jnp.zeros((), x.dtype))


def _rewind_deltanet(layer: DeltaNetCache, count: jax.Array) -> DeltaNetCache:
    return DeltaNetCache(
        conv=_shift_right(layer.conv, count, axis=2),
        state=_shift_right(layer.state, count, axis=2),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Fill:
    """Where a cached call's tokens go (after valid tokens were moved to the front of a row).

    Attributes:
        start: int32[B], the row's `end` before the call (slot of the call's first token).
        count: int32[B], valid tokens in the call (they are tokens 0 .. count-1).
        valid: bool[B, T], `arange(T) < count`.
        empty: static: the cache held nothing before the call (`Cache.empty`).
    """

    start: jax.Array
    count: jax.Array
    valid: jax.Array
    empty: bool = dataclasses.field(default=False, metadata=dict(static=True))


def conv_channels(config: QwenConfig) -> int:
    """Channels of the DeltaNet causal conv (q | k | v)."""
    c = config
    return 2 * c.linear_num_key_heads * c.linear_key_head_dim + (
        c.linear_num_value_heads * c.linear_value_head_dim
    )


def init_layer_cache(
    config: QwenConfig,
    kind: str,
    *,
    repeats: int,
    batch: int,
    max_length: int,
    rollback: int = 0,
) -> AttentionCache | DeltaNetCache:
    """An empty cache for `repeats` stacked layers of type `kind`."""
    c = config
    if kind == "full_attention":
        shape = (repeats, batch, max_length, c.num_kv_heads, c.head_dim)
        zeros = jnp.zeros(shape, P.to_dtype(c.dtype))
        return AttentionCache(k=zeros, v=zeros)
    history = rollback + 1
    conv = jnp.zeros(
        (repeats, batch, c.linear_conv_kernel_dim - 2 + history, conv_channels(c)),
        P.to_dtype(c.dtype),
    )
    state = jnp.zeros(
        (
            repeats,
            batch,
            history,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        ),
        jnp.float32,
    )
    return DeltaNetCache(conv=conv, state=state)


def init_cache(config: QwenConfig, batch: int, max_length: int, *, rollback: int = 0) -> Cache:
    """An empty cache for a `Qwen` of `config`: `batch` rows of `max_length` slots.

    Args:
        config: the model's config.
        batch: rows (sequences).
        max_length: slots per row: prompt plus generated tokens must fit.
        rollback: how many newest tokens `Cache.rewind` may take back (speculative decoding
            with k draft tokens needs k). Costs `rollback` more DeltaNet states per layer.
    """
    if batch < 1 or max_length < 1 or rollback < 0:
        raise ValueError(
            f"init_cache: need batch >= 1, max_length >= 1, rollback >= 0; got {batch}, "
            f"{max_length}, {rollback}"
        )
    layers = tuple(
        init_layer_cache(
            config,
            kind,
            repeats=config.num_blocks,
            batch=batch,
            max_length=max_length,
            rollback=rollback,
        )
        for kind in config.block_pattern
    )
    return Cache(end=jnp.zeros((batch,), jnp.int32), layers=layers, empty=True)


def cache_logical_axes(cache: Cache) -> Cache:
    """The cache's tree with a tuple of logical axis names per array (for sharding rules)."""

    def layer(entry):
        if isinstance(entry, AttentionCache):
            names = (P.LAYERS, "batch", "cache_seq", P.KV_HEADS, P.HEAD_DIM)
            return AttentionCache(k=names, v=names)
        return DeltaNetCache(
            conv=(P.LAYERS, "batch", None, "conv"),
            state=(P.LAYERS, "batch", None, P.DELTA_V_HEADS, P.DELTA_K_DIM, P.DELTA_V_DIM),
        )

    return Cache(end=("batch",), layers=tuple(layer(e) for e in cache.layers), empty=cache.empty)


def constrain_cache(cache: Cache) -> Cache:
    """The cache with every array pinned to the layout its logical axes ask for under the
    active sharding rules (`hat_jax.sharding.constrain`: rows over the batch axes when
    sampling on a mesh); the cache itself without a mesh."""
    return jax.tree.map(constrain, cache, cache_logical_axes(cache))


def compact_rows(x: jax.Array, lead: jax.Array) -> jax.Array:
    """Moves each row's tokens `lead[b]` places to the front (x: [B, T, ...])."""
    length = x.shape[1]
    index = jnp.minimum(jnp.arange(length)[None, :] + lead[:, None], length - 1)
    index = index.reshape(index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def restore_rows(x: jax.Array, lead: jax.Array) -> jax.Array:
    """Inverse of `compact_rows` on the valid tokens (padding positions get arbitrary rows)."""
    length = x.shape[1]
    index = jnp.maximum(jnp.arange(length)[None, :] - lead[:, None], 0)
    index = index.reshape(index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def plan_fill(
    input_ids: jax.Array, segment_ids: jax.Array | None, cache: Cache
) -> tuple[Fill, jax.Array | None]:
    """`(Fill, lead)` of a cached call; `lead` (leading padding per row) is None when the call
    has no padding (no `segment_ids`), so nothing needs moving."""
    batch, length = input_ids.shape
    if segment_ids is None:
        count = jnp.full((batch,), length, jnp.int32)
        valid = jnp.ones((batch, length), bool)
        return Fill(start=cache.end, count=count, valid=valid, empty=cache.empty), None
    if segment_ids.shape != input_ids.shape:
        raise ValueError(
            f"segment_ids shape {segment_ids.shape} != input_ids shape {input_ids.shape}"
        )
    is_valid = segment_ids != 0
    count = jnp.sum(is_valid, axis=1, dtype=jnp.int32)
    lead = jnp.where(count > 0, jnp.argmax(is_valid, axis=1), 0).astype(jnp.int32)
    valid = jnp.arange(length)[None, :] < count[:, None]
    return Fill(start=cache.end, count=count, valid=valid, empty=cache.empty), lead


def prepare_call(
    cache: Cache,
    input_ids: jax.Array,
    segment_ids: jax.Array | None,
    positions: jax.Array | None,
    *rows: jax.Array,
) -> tuple[Fill, jax.Array | None, Segments, jax.Array, tuple[jax.Array, ...]]:
    """Everything a cached call needs before it runs its layers.

    Plans the fill (`plan_fill`), moves each row's valid tokens to the front (`input_ids`,
    `positions` and any extra per-token `rows`, e.g. the MTP head's hidden states), and gives
    default positions continuing each row (`end[b]`, `end[b] + 1`, ...).

    Returns:
      `(fill, lead, segments, input_ids, rows)`: `lead` is None when nothing was moved; pass
      it to `restore_outputs` to put the outputs back in the caller's layout.
    """
    fill, lead = plan_fill(input_ids, segment_ids, cache)
    if lead is not None:
        input_ids, *moved = (compact_rows(x, lead) for x in (input_ids, *rows))
        rows = tuple(moved)
        positions = None if positions is None else compact_rows(positions, lead)
    if positions is None:
        steps = jnp.arange(input_ids.shape[1], dtype=jnp.int32)
        positions = fill.start[:, None] + steps[None, :]
    segments = Segments(
        doc=jnp.zeros(input_ids.shape, jnp.int32),
        positions=positions.astype(jnp.int32),
        valid=fill.valid,
    )
    return fill, lead, segments, input_ids, tuple(rows)


def restore_outputs(lead: jax.Array | None, *outputs: jax.Array) -> tuple[jax.Array, ...]:
    """`restore_rows` of each output, or the outputs as they are when `lead` is None."""
    if lead is None:
        return outputs
    return tuple(restore_rows(x, lead) for x in outputs)
