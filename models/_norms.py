"""RMSNorm in both Qwen conventions, the gated RMSNorm of DeltaNet, and L2 normalisation.

Qwen3.5 stores norm weights zero-centred and scales by (1 + w) (Gemma style); Qwen3-MoE
stores them plainly and scales by w. Both normalise in float32; like transformers, Qwen3.5
applies its weight in float32 and casts after, Qwen3 casts first and applies the weight in
the input dtype. The DeltaNet output
norm is always plain `w` and gates with silu(z).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import _params as P


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in float32 (the FLA convention)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis with scale `offset + weight`.

    Args:
        size: normalised width.
        axis_name: logical axis name of the weight.
        eps: added to the mean square.
        offset: 1.0 for zero-centred (Qwen3.5) weights, 0.0 for plain (Qwen3) weights.
        param_dtype: storage dtype of the weight.
    """

    def __init__(self, size: int, axis_name: str, *, eps: float, offset: float, param_dtype):
        self.eps = eps
        self.offset = offset
        init = 0.0 if offset else 1.0
        self.weight = P.constant((size,), (axis_name,), value=init, dtype=param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.offset:
            scale = self.offset + self.weight[...].astype(jnp.float32)
            return (rms_normalize(x, self.eps) * scale).astype(x.dtype)
        return rms_normalize(x, self.eps).astype(x.dtype) * self.weight[...].astype(x.dtype)


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """DeltaNet output norm: `w * rms_normalize(x) * silu(gate)`, computed in float32."""
    y = rms_normalize(x, eps) * weight.astype(jnp.float32)
    return (y * P.silu(gate.astype(jnp.float32))).astype(x.dtype)
