"""Gated DeltaNet token mixer (Qwen3.5 "linear_attention" layers).

    q, k, v = silu(causal_depthwise_conv(x W_qkv))      conv over the q|k|v channels
    q, k    = l2norm(q), l2norm(k), repeated to the value heads
    beta    = sigmoid(x W_b);   g = -exp(A_log) * softplus(x W_a + dt_bias)
    o       = gated_delta_rule(q, k, v, g, beta)
    y       = W_out (rms_norm(o) * w_norm * silu(x W_z))   per value head

Both the conv and the recurrent state restart at every segment start. The conv's weights
are stored per q/k/v group ([kernel, heads, head_dim]) so heads can be sharded; the
projections and convs are concatenated at run time into one matmul and one conv.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import _params as P
from models._config import QwenConfig
from models._delta_rule import chunked_gated_delta_rule
from models._norms import gated_rms_norm, l2_normalize
from models._positions import Segments


def causal_conv(x: jax.Array, weight: jax.Array, doc: jax.Array) -> jax.Array:
    """Depthwise causal conv that does not reach across segment starts.

    Args:
        x: [B, T, C] inputs.
        weight: [K, C]; weight[K - 1] multiplies the current token, weight[K - 1 - s] the
            token s steps back.
        doc: int[B, T] segment index; taps from another segment read zero.

    Returns:
        [B, T, C] (no activation).
    """
    kernel = weight.shape[0]
    length = x.shape[1]
    out = x * weight[kernel - 1]
    for s in range(1, min(kernel, length + 1)):
        shifted = jnp.pad(x, ((0, 0), (s, 0), (0, 0)))[:, :length]
        shifted_doc = jnp.pad(doc, ((0, 0), (s, 0)), constant_values=-1)[:, :length]
        same = (shifted_doc == doc)[..., None].astype(x.dtype)
        out = out + shifted * same * weight[kernel - 1 - s]
    return out


class GatedDeltaNet(nnx.Module):
    """The linear-attention token mixer of one Qwen3.5 layer."""

    def __init__(self, config: QwenConfig):
        c = config
        self.config = c
        pd = P.to_dtype(c.param_dtype)
        std = c.initializer_range
        e, kh, vh = c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads
        kd, vd, kw = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim
        k_names = (P.EMBED, P.DELTA_K_HEADS, P.DELTA_K_DIM)
        v_names = (P.EMBED, P.DELTA_V_HEADS, P.DELTA_V_DIM)

        def normal(shape, names):
            return P.normal(shape, names, std=std, dtype=pd)

        self.q_proj = normal((e, kh, kd), k_names)
        self.k_proj = normal((e, kh, kd), k_names)
        self.v_proj = normal((e, vh, vd), v_names)
        self.z_proj = normal((e, vh, vd), v_names)
        self.b_proj = normal((e, vh), (P.EMBED, P.DELTA_V_HEADS))
        self.a_proj = normal((e, vh), (P.EMBED, P.DELTA_V_HEADS))
        self.q_conv = normal((kw, kh, kd), (P.CONV_KERNEL, P.DELTA_K_HEADS, P.DELTA_K_DIM))
        self.k_conv = normal((kw, kh, kd), (P.CONV_KERNEL, P.DELTA_K_HEADS, P.DELTA_K_DIM))
        self.v_conv = normal((kw, vh, vd), (P.CONV_KERNEL, P.DELTA_V_HEADS, P.DELTA_V_DIM))
        # A = exp(A_log) ~ U(0.01, 16) and dt_bias = 1, as transformers initialises them.
        self.A_log = P.log_uniform((vh,), (P.DELTA_V_HEADS,), low=0.01, high=16.0, dtype=pd)
        self.dt_bias = P.constant((vh,), (P.DELTA_V_HEADS,), value=1.0, dtype=pd)
        self.norm = P.constant((vd,), (P.DELTA_V_DIM,), value=1.0, dtype=pd)
        self.out_proj = normal((vh, vd, e), (P.DELTA_V_HEADS, P.DELTA_V_DIM, P.EMBED))

    def _project(self, x: jax.Array) -> tuple[jax.Array, ...]:
        """qkv (conv channels), z, b, a from one fused matmul."""
        kernels = [self.q_proj, self.k_proj, self.v_proj, self.z_proj, self.b_proj, self.a_proj]
        flat = [w[...].reshape(w.shape[0], -1).astype(x.dtype) for w in kernels]
        sizes = [f.shape[1] for f in flat]
        y = x @ jnp.concatenate(flat, axis=1)
        bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        q, k, v, z, b, a = jnp.split(y, bounds, axis=-1)
        return jnp.concatenate([q, k, v], axis=-1), z, b, a

    def __call__(
        self,
        x: jax.Array,
        segments: Segments,
        rope=None,
        cache=None,
    ) -> tuple[jax.Array, None]:
        """x [B, T, E] -> ([B, T, E], cache). `cache` must be None (decode is not built yet)."""
        del rope  # DeltaNet has no positional encoding
        if cache is not None:
            raise NotImplementedError("GatedDeltaNet: cached decoding is not implemented yet")
        c = self.config
        batch, length, _ = x.shape
        kh, vh = c.linear_num_key_heads, c.linear_num_value_heads
        kd, vd = c.linear_key_head_dim, c.linear_value_head_dim
        qkv, z, b, a = self._project(x)
        conv_w = jnp.concatenate(
            [w[...].reshape(w.shape[0], -1) for w in (self.q_conv, self.k_conv, self.v_conv)],
            axis=1,
        ).astype(x.dtype)
        qkv = P.silu(causal_conv(qkv, conv_w, segments.doc))
        q, k, v = jnp.split(qkv, [kh * kd, 2 * kh * kd], axis=-1)
        repeat = vh // kh
        q = jnp.repeat(l2_normalize(q.reshape(batch, length, kh, kd)), repeat, axis=2)
        k = jnp.repeat(l2_normalize(k.reshape(batch, length, kh, kd)), repeat, axis=2)
        v = v.reshape(batch, length, vh, vd).astype(jnp.float32)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        a_f = a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a_f)
        o, _ = chunked_gated_delta_rule(
            q, k, v, g, beta, segments.doc, chunk_size=c.deltanet_chunk_size
        )
        o = gated_rms_norm(
            o.astype(x.dtype), z.reshape(batch, length, vh, vd), self.norm[...], c.rms_norm_eps
        )
        y = jnp.einsum("bthd,hde->bte", o, self.out_proj[...].astype(x.dtype))
        return y, None
