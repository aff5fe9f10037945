"""Gated DeltaNet token mixer (Qwen3.5 "linear_attention" layers).

    q, k, v = silu(causal_depthwise_conv(x W_qkv))      conv over the q|k|v channels
    q, k    = l2norm(q), l2norm(k), repeated to the value heads
    beta    = sigmoid(x W_b);   g = -exp(A_log) * softplus(x W_a + dt_bias)
    o       = gated_delta_rule(q, k, v, g, beta)
    y       = W_out (rms_norm(o) * w_norm * silu(x W_z))   per value head

Both the conv and the recurrent state restart at every segment start. The conv's weights
are stored per q/k/v group ([kernel, heads, head_dim]) so heads can be sharded; the
projections and convs are concatenated at run time into one matmul and one conv.

With a cache (`models._cache.DeltaNetCache`) the conv reads the row's previous inputs and the
delta rule continues the row's state: token by token (`delta_rule_steps`, keeping the state
after every token for rollback) for calls of at most R tokens (decode, speculative
verification), chunked for longer ones (prefill). Padding tokens leave the state unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import _params as P
from models._cache import DeltaNetCache, Fill
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
    lead = kernel - 1
    # One padded copy read at K - 1 offsets (XLA on CPU materialised a pad per tap).
    padded = jnp.pad(x, ((0, 0), (lead, 0), (0, 0)))
    padded_doc = jnp.pad(doc, ((0, 0), (lead, 0)), constant_values=-1)
    out = x * weight[lead]
    for s in range(1, kernel):
        lo = lead - s
        same = (padded_doc[:, lo : lo + length] == doc)[..., None]
        out = out + jnp.where(same, padded[:, lo : lo + length], 0.0) * weight[lead - s]
    return out


def delta_rule_steps(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    state: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The gated delta rule token by token from `state`, keeping the state after each token.

    Args:
        q, k: f32[B, T, H, Dk] (L2-normalised); v: f32[B, T, H, Dv]; g, beta: f32[B, T, H].
        state: f32[B, H, Dk, Dv], the state before the first token.

    Returns:
        (o f32[B, T, H, Dv], states f32[B, T, H, Dk, Dv]: the state after token t).
    """
    q = q * (k.shape[-1] ** -0.5)

    def step(s, inputs):
        q_t, k_t, v_t, g_t, b_t = inputs
        s = s * jnp.exp(g_t)[..., None, None]
        delta = (v_t - jnp.einsum("bhkv,bhk->bhv", s, k_t)) * b_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, (jnp.einsum("bhkv,bhk->bhv", s, q_t), s)

    xs = [jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta)]
    _, (out, states) = jax.lax.scan(step, state, xs, unroll=True)
    return jnp.moveaxis(out, 0, 1), jnp.moveaxis(states, 0, 1)


def _take_window(x: jax.Array, start: jax.Array, size: int) -> jax.Array:
    """Per row b, x[b, start[b] : start[b] + size] (x: [B, L, ...])."""
    return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size, axis=0))(x, start)


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
        # Tokens flattened to rows: a plain 2-D matmul (XLA's CPU 3-D form is slower).
        y = x.reshape(-1, x.shape[-1]) @ jnp.concatenate(flat, axis=1)
        y = y.reshape(*x.shape[:-1], -1)
        bounds = [sum(sizes[:i]) for i in range(1, len(sizes))]
        q, k, v, z, b, a = jnp.split(y, bounds, axis=-1)
        return jnp.concatenate([q, k, v], axis=-1), z, b, a

    def __call__(
        self,
        x: jax.Array,
        segments: Segments,
        rope=None,
        cache: DeltaNetCache | None = None,
        fill: Fill | None = None,
    ) -> tuple[jax.Array, DeltaNetCache | None]:
        """x [B, T, E] -> ([B, T, E], updated cache or None).

        Without a cache, conv and state restart at every segment of `segments`. With `cache`
        (one layer's conv inputs and states) and `fill`, the call's valid tokens continue the
        row (conv reads the cached inputs, the delta rule starts from the cached state).
        """
        del rope  # DeltaNet has no positional encoding
        c = self.config
        batch, length, _ = x.shape
        kh, vh = c.linear_num_key_heads, c.linear_num_value_heads
        kd, vd = c.linear_key_head_dim, c.linear_value_head_dim
        qkv, z, b, a = self._project(x)
        conv_w = jnp.concatenate(
            [w[...].reshape(w.shape[0], -1) for w in (self.q_conv, self.k_conv, self.v_conv)],
            axis=1,
        ).astype(x.dtype)
        if cache is None:
            qkv = causal_conv(qkv, conv_w, segments.doc)
        else:
            window = cache.conv.shape[1]
            inputs = jnp.concatenate([cache.conv.astype(qkv.dtype), qkv], axis=1)
            qkv = causal_conv(inputs, conv_w, jnp.zeros(inputs.shape[:2], jnp.int32))
            qkv = qkv[:, window:]
            new_conv = _take_window(inputs, fill.count, window)
        qkv = P.silu(qkv)
        q, k, v = jnp.split(qkv, [kh * kd, 2 * kh * kd], axis=-1)
        repeat = vh // kh
        q = jnp.repeat(l2_normalize(q.reshape(batch, length, kh, kd)), repeat, axis=2)
        k = jnp.repeat(l2_normalize(k.reshape(batch, length, kh, kd)), repeat, axis=2)
        v = v.reshape(batch, length, vh, vd).astype(jnp.float32)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        a_f = a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a_f)
        if cache is None:
            o, _ = chunked_gated_delta_rule(
                q, k, v, g, beta, segments.doc, chunk_size=c.deltanet_chunk_size
            )
        else:
            o, new_state = self._continue_state(q, k, v, g, beta, cache.state, fill)
            cache = DeltaNetCache(conv=new_conv.astype(cache.conv.dtype), state=new_state)
        o = gated_rms_norm(
            o.astype(x.dtype), z.reshape(batch, length, vh, vd), self.norm[...], c.rms_norm_eps
        )
        out_proj = self.out_proj[...].astype(x.dtype).reshape(vh * vd, -1)
        y = (o.reshape(batch * length, vh * vd) @ out_proj).reshape(batch, length, -1)
        return y, cache

    def _continue_state(self, q, k, v, g, beta, history, fill: Fill):
        """Delta rule from the row's newest state; returns (o, the new state history)."""
        keep = fill.valid[..., None]  # padding: no decay, no write
        g = jnp.where(keep, g, 0.0)
        beta = jnp.where(keep, beta, 0.0)
        batch, length = q.shape[:2]
        size = history.shape[1]
        if length <= size:
            o, states = delta_rule_steps(q, k, v, g, beta, history[:, -1])
            new = _take_window(jnp.concatenate([history, states], axis=1), fill.count, size)
            return o, new
        doc = jnp.zeros((batch, length), jnp.int32)
        o, final = chunked_gated_delta_rule(
            q, k, v, g, beta, doc,
            chunk_size=self.config.deltanet_chunk_size, initial_state=history[:, -1],
        )  # fmt: skip
        # Only the final state is known: older history entries repeat it (not rewindable).
        return o, jnp.broadcast_to(final[:, None], history.shape)
