"""Block-wise (flash) attention equals the dense masked softmax attention, values and gradients,
on packed rows with padding; and the model gives the same logits and gradients with either."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from models import flash_attention


def _docs(segment_ids: np.ndarray) -> jnp.ndarray:
    start = np.concatenate(
        [np.ones((segment_ids.shape[0], 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1
    )
    return jnp.asarray(np.cumsum(start, axis=1) - 1, jnp.int32)


def _dense(q, k, v, doc):
    """The reference: the [T, T] softmax with the model's causal, block-diagonal mask."""
    t, d = q.shape[1], q.shape[-1]
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") / np.sqrt(d)
    mask = (np.arange(t)[None, :] <= np.arange(t)[:, None])[None] & (
        doc[:, None, :] == doc[:, :, None]
    )
    p = jax.nn.softmax(jnp.where(mask[:, None], s, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", p, v, precision="highest")


def _inputs(seed, batch, length, heads, kv, dim, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q, k, v = (
        jnp.asarray(rng.normal(size=s), dtype)
        for s in [(batch, length, heads, dim), (batch, length, kv, dim), (batch, length, kv, dim)]
    )
    seg = np.ones((batch, length), np.int32)
    for row in range(batch):  # random packing: 1-4 documents then padding (id 0)
        cuts = np.sort(rng.choice(np.arange(1, length), size=rng.integers(1, 4), replace=False))
        for n, cut in enumerate(cuts):
            seg[row, cut:] = n + 2
        seg[row, length - rng.integers(0, length // 4) :] = 0
    return q, k, v, _docs(seg)


@pytest.mark.parametrize(
    "length, heads, kv, block",
    [(100, 4, 2, 32), (37, 4, 1, 16), (50, 2, 2, 512)],
)
def test_flash_equals_dense_values_and_gradients(length, heads, kv, block):
    q, k, v, doc = _inputs(length, 2, length, heads, kv, 16)
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

    @jax.jit
    def both(q, k, v):
        flash = lambda q, k, v: flash_attention(q, k, v, doc=doc, block_size=block)  # noqa: E731
        dense = lambda q, k, v: _dense(q, k, v, doc)  # noqa: E731
        return [
            jax.value_and_grad(lambda *a, f=f: jnp.sum(f(*a) * w), argnums=(0, 1, 2))(q, k, v)
            for f in (flash, dense)
        ] + [flash(q, k, v), dense(q, k, v)]

    (_, got_grads), (_, want_grads), got, want = both(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for g, r, name in zip(got_grads, want_grads, "qkv", strict=True):
        scale = float(jnp.abs(r).max())
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5 * scale, err_msg=f"d{name}")


def test_flash_in_bfloat16_is_close_to_float32():
    q, k, v, doc = _inputs(3, 1, 128, 4, 2, 32)
    run = jax.jit(lambda q, k, v: flash_attention(q, k, v, doc=doc, block_size=32))
    ref = run(q, k, v)
    low = run(*(x.astype(jnp.bfloat16) for x in (q, k, v))).astype(jnp.float32)
    assert low.dtype == jnp.float32 and float(jnp.abs(low - ref).max()) < 0.05


def test_flash_rejects_bad_shapes():
    q, k, v, doc = _inputs(4, 1, 32, 4, 2, 8)
    with pytest.raises(ValueError, match="self-attention"):
        flash_attention(q, k[:, :16], v[:, :16], doc=doc)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        flash_attention(q[:, :, :3], k, v, doc=doc)
    with pytest.raises(ValueError, match="block_size"):
        flash_attention(q, k, v, doc=doc, block_size=0)


# The DeltaNet decay parameters (A_log, dt_bias) get gradients summed from many cancelling
# terms: reordering any float32 sum upstream moves them by ~1e-4 relative (flash attention with
# blocks of 16 and of 32 differ from each other by as much as either does from dense).
_ILL_CONDITIONED = ("A_log", "dt_bias")


@pytest.mark.slow
def test_model_with_flash_attention_equals_dense():
    dense_cfg = models.QwenConfig.preset("tiny")
    flash_cfg = dense_cfg.replace(attention_impl="flash", attention_block_size=32)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, dense_cfg.vocab_size, (2, 150)))
    seg = np.ones((2, 150), np.int32)
    seg[0, 60:] = 2
    seg[1, 140:] = 0
    seg = jnp.asarray(seg)
    results = []
    for cfg in (dense_cfg, flash_cfg):
        graphdef, params = nnx.split(models.Qwen(cfg, rngs=nnx.Rngs(0)))

        def loss(p, graphdef=graphdef):
            logits = nnx.merge(graphdef, p)(ids, segment_ids=seg).logits
            return jnp.sum(logits * jnp.sin(jnp.arange(logits.shape[-1]))), logits

        results.append(jax.jit(jax.value_and_grad(loss, has_aux=True))(params))
    ((_, want), g_want), ((_, got), g_got) = results
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    leaves = jax.tree_util.tree_flatten_with_path(g_want)[0]
    for (path, b), a in zip(leaves, jax.tree.leaves(g_got), strict=True):
        name = jax.tree_util.keystr(path)
        tol = 1e-3 if any(p in name for p in _ILL_CONDITIONED) else 1e-5
        error = float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))
        assert error < tol, f"{name}: relative gradient error {error:.2e}"
