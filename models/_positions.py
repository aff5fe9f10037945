"""Packed-sequence bookkeeping (segments, per-segment positions) and rotary embeddings.

Conventions for `segment_ids [B, T]` (int):
- a *segment* (document) is a maximal run of equal ids along the row; a new segment starts
  wherever the id changes, so the values themselves only need to differ between neighbours
  (packers usually number documents 1, 2, 3, ...);
- id 0 marks padding. Padding runs are segments of their own, so they never leak into real
  tokens; they are excluded from the router load-balancing statistics.
Attention is block-diagonal causal over segments, DeltaNet's conv and recurrent state reset
at every segment start, and default positions restart at 0 in each segment.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Segments:
    """Per-token segment data derived from `segment_ids`.

    Attributes:
        doc: int32[B, T], the running index of the segment each token belongs to
            (increases by one at every segment start).
        positions: int32[B, T], RoPE positions.
        valid: bool[B, T], False on padding (segment id 0).
    """

    doc: jax.Array
    positions: jax.Array
    valid: jax.Array


def segments_from_ids(
    input_ids: jax.Array,
    segment_ids: jax.Array | None,
    positions: jax.Array | None,
) -> Segments:
    """Builds `Segments`; missing `segment_ids` mean one segment per row."""
    batch, length = input_ids.shape
    if segment_ids is None:
        doc = jnp.zeros((batch, length), jnp.int32)
        valid = jnp.ones((batch, length), bool)
        default_pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    else:
        if segment_ids.shape != input_ids.shape:
            raise ValueError(
                f"segment_ids shape {segment_ids.shape} != input_ids shape {input_ids.shape}"
            )
        seg = segment_ids.astype(jnp.int32)
        start = jnp.concatenate([jnp.ones((batch, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
        doc = jnp.cumsum(start, axis=1, dtype=jnp.int32) - 1
        index = jnp.arange(length, dtype=jnp.int32)
        seg_start = jax.lax.cummax(jnp.where(start, index, 0), axis=1)
        default_pos = index - seg_start
        valid = seg != 0
    if positions is None:
        positions = default_pos
    elif positions.shape != input_ids.shape:
        raise ValueError(f"positions shape {positions.shape} != input_ids shape {input_ids.shape}")
    return Segments(doc=doc, positions=positions.astype(jnp.int32), valid=valid)


def rope_inverse_frequencies(rotary_dim: int, theta: float) -> np.ndarray:
    """1 / theta^(2i / rotary_dim), in float32 as transformers computes it."""
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def rope_angles(positions: jax.Array, rotary_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin of positions * inv_freq: float32[B, T, rotary_dim // 2]."""
    inv_freq = jnp.asarray(rope_inverse_frequencies(rotary_dim, theta))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first 2 * cos.shape[-1] channels of x [B, T, H, D] (half-split pairs).

    Channel i pairs with channel i + rotary_dim / 2 ("rotate_half"); channels past the rotary
    dims pass through unchanged (partial RoPE).
    """
    half = cos.shape[-1]
    cos = cos[:, :, None, :]
    sin = sin[:, :, None, :]
    x1 = x[..., :half].astype(jnp.float32)
    x2 = x[..., half : 2 * half].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return jnp.concatenate([rotated.astype(x.dtype), x[..., 2 * half :]], axis=-1)
