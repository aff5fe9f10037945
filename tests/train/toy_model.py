"""A small decoder with the same interface as `models.Qwen`, for testing the training core.

Stacked, scanned layers of segment-aware causal attention and a top-k MoE with a dense
reference dispatch and a load-balancing auxiliary loss; every parameter carries logical axis
names. Independent of `models/` so the core's tests do not depend on the model's internals.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig:
    vocab: int = 64
    hidden: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    experts: int = 8
    top_k: int = 2
    expert_mlp: int = 16


@struct.dataclass
class ToyOutput:
    logits: jax.Array
    hidden: jax.Array
    aux_loss: jax.Array


class _Init:
    """numpy draws: eager `jax.random` compiles one program per shape, slow for a test model."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def __call__(self, shape, names, scale=None):
        scale = scale if scale is not None else shape[-2] ** -0.5
        value = scale * self.rng.standard_normal(shape, np.float32)
        return nnx.Param(jnp.asarray(value), eager_sharding=False, out_sharding=names)


def _rms(x, w):
    x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
    return x * (1.0 + w)


class ToyLM(nnx.Module):
    def __init__(self, config: ToyConfig, *, seed: int = 0):
        c, n = config, config.layers
        rngs = _Init(seed)
        self.config = c
        self.embed_tokens = rngs((c.vocab, c.hidden), ("vocab", "embed"), 1.0)
        self.ln1 = nnx.Param(
            jnp.zeros((n, c.hidden)), eager_sharding=False, out_sharding=("layers", "embed")
        )
        self.ln2 = nnx.Param(
            jnp.zeros((n, c.hidden)), eager_sharding=False, out_sharding=("layers", "embed")
        )
        names_q = ("layers", "embed", "q_heads", "head_dim")
        names_kv = ("layers", "embed", "kv_heads", "head_dim")
        self.wq = rngs((n, c.hidden, c.heads, c.head_dim), names_q, c.hidden**-0.5)
        self.wk = rngs((n, c.hidden, c.kv_heads, c.head_dim), names_kv, c.hidden**-0.5)
        self.wv = rngs((n, c.hidden, c.kv_heads, c.head_dim), names_kv, c.hidden**-0.5)
        self.wo = rngs(
            (n, c.heads, c.head_dim, c.hidden), ("layers", "q_heads", "head_dim", "embed")
        )
        self.router = rngs((n, c.hidden, c.experts), ("layers", "embed", "expert"))
        e_in = ("layers", "expert", "embed", "expert_mlp")
        self.w_gate = rngs((n, c.experts, c.hidden, c.expert_mlp), e_in)
        self.w_up = rngs((n, c.experts, c.hidden, c.expert_mlp), e_in)
        self.w_down = rngs(
            (n, c.experts, c.expert_mlp, c.hidden),
            ("layers", "expert", "expert_mlp", "embed"),
        )
        self.norm = nnx.Param(jnp.zeros((c.hidden,)), eager_sharding=False, out_sharding=("embed",))
        self.lm_head = rngs((c.hidden, c.vocab), ("embed", "vocab"))

    def _attention(self, x, w, mask):
        c = self.config
        q = jnp.einsum("bth,hnd->btnd", x, w["wq"])
        k = jnp.einsum("bth,hnd->btnd", x, w["wk"])
        v = jnp.einsum("bth,hnd->btnd", x, w["wv"])
        rep = c.heads // c.kv_heads
        k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
        scores = jnp.einsum("btnd,bsnd->bnts", q, k) * c.head_dim**-0.5
        scores = jnp.where(mask[:, None], scores, -1e30)
        out = jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(scores, -1), v)
        return jnp.einsum("btnd,ndh->bth", out, w["wo"])

    def _moe(self, x, w, valid):
        c = self.config
        probs = jax.nn.softmax(jnp.einsum("bth,he->bte", x, w["router"]), -1)
        top, idx = jax.lax.top_k(probs, c.top_k)
        gates = jnp.sum(
            jax.nn.one_hot(idx, c.experts) * (top / top.sum(-1, keepdims=True))[..., None], -2
        )
        h = jax.nn.silu(jnp.einsum("bth,ehi->btei", x, w["w_gate"]))
        h = h * jnp.einsum("bth,ehi->btei", x, w["w_up"])
        y = jnp.einsum("btei,eih,bte->bth", h, w["w_down"], gates)
        chosen = jnp.sum(jax.nn.one_hot(idx, c.experts), -2)
        count = jnp.maximum(valid.sum(), 1.0)
        frac = jnp.sum(chosen * valid[..., None], (0, 1)) / (count * c.top_k)
        prob = jnp.sum(probs * valid[..., None], (0, 1)) / count
        return y, c.experts * jnp.sum(frac * prob)

    def __call__(self, input_ids, *, positions=None, segment_ids=None, cache=None):
        del positions, cache
        if segment_ids is None:
            segment_ids = jnp.ones_like(input_ids)
        t = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = causal[None] & same
        valid = (segment_ids > 0).astype(jnp.float32)
        x = self.embed_tokens[...][input_ids]
        stacked = {k: getattr(self, k)[...] for k in ("ln1", "ln2", "wq", "wk", "wv", "wo")}
        stacked |= {k: getattr(self, k)[...] for k in ("router", "w_gate", "w_up", "w_down")}

        def layer(x, w):
            x = x + self._attention(_rms(x, w["ln1"]), w, mask)
            y, aux = self._moe(_rms(x, w["ln2"]), w, valid)
            return x + y, aux

        x, aux = jax.lax.scan(layer, x, stacked)
        hidden = _rms(x, self.norm[...])
        logits = hidden @ self.lm_head[...]
        return ToyOutput(logits=logits, hidden=hidden, aux_loss=jnp.mean(aux))


class LinearLM(nnx.Module):
    """The smallest model with the `Qwen` call interface: embedding -> linear head.

    For tests of the loop, checkpoints and the guard, where the model's content is irrelevant
    and compile time is not.
    """

    def __init__(self, vocab: int = 64, hidden: int = 16, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.embed_tokens = nnx.Embed(
            vocab,
            hidden,
            rngs=rngs,
            param_dtype=dtype,
            embedding_metadata={"out_sharding": ("vocab", "embed")},
        )
        self.lm_head = nnx.Linear(
            hidden,
            vocab,
            use_bias=False,
            rngs=rngs,
            param_dtype=dtype,
            kernel_metadata={"out_sharding": ("embed", "vocab")},
        )

    def __call__(self, input_ids, *, positions=None, segment_ids=None, cache=None):
        hidden = jnp.tanh(self.embed_tokens(input_ids))
        return ToyOutput(logits=self.lm_head(hidden), hidden=hidden, aux_loss=jnp.zeros(()))
