"""Block-wise ("flash") attention for training on long packed rows: O(T) memory, not O(T^2).

The dense `models._attention.attend` materialises the float32 score matrix `[B, H, T, T]`
(4 GiB per row of 8K tokens at Qwen3.5's 16 heads, per layer, twice more in the backward
pass). Here the queries and keys are cut into blocks of `block_size` positions and the
softmax is accumulated online, block by block (Dao et al., FlashAttention-2):

    m_i = max_j s_ij,   l_i = sum_j exp(s_ij - m_i),   o_i = sum_j exp(s_ij - m_i) v_j / l_i

with the running maximum rescaling what was accumulated so far. The backward pass is a
custom VJP that recomputes each block's probabilities from the saved log-sum-exp
`m_i + log l_i` (FlashAttention's recomputation), so nothing of size T x T is ever stored:
the residuals are q, k, v, the output and the log-sum-exp.

The mask is the model's: causal by position in the row and block-diagonal over documents
(`doc` indices, as in `models._positions.Segments`). Key blocks entirely in the future of a
query block are never visited (about half of the work): the loop over key blocks of query
block i runs over blocks 0..i (a `fori_loop` with that bound, a while loop: neither the
forward nor the backward pass is ever differentiated by JAX, and unlike a `lax.cond` per
block pair it leaves JAX's scan partial evaluation nothing to stack across the model's layer
loop). The bounds depend only on loop indices, so they cost no communication when the batch
is sharded. A query row with no visible key
(never the case for self-attention, where every token sees itself) gives zeros.

Numerically this is the dense softmax attention reordered: at float32 it agrees to rounding
(tests/models/test_flash.py); at bfloat16 the unnormalised probabilities are rounded before
the value matmul instead of the normalised ones.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_NEG = -jnp.inf


def _pad_to(x: jax.Array, length: int, value=0) -> jax.Array:
    pad = length - x.shape[1]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def _blocks(x: jax.Array, size: int) -> jax.Array:
    """[B, T, ...] -> [T / size, B, size, ...] (block-major, for scanning)."""
    b, t = x.shape[:2]
    return jnp.moveaxis(x.reshape(b, t // size, size, *x.shape[2:]), 1, 0)


def _unblocks(x: jax.Array) -> jax.Array:
    """Inverse of `_blocks`."""
    n, b, size = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(b, n * size, *x.shape[3:])


def _scores(q, k, q_doc, k_doc, i, j, size):
    """Masked scaled scores of query block i against key block j: f32[B, KV, G, bq, bk].

    q: [B, bq, KV, G, D]; k: [B, bk, KV, D]; docs: int[B, bq] / int[B, bk].
    """
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=jnp.float32)
    s = s * (q.shape[-1] ** -0.5)
    q_pos = i * size + jnp.arange(size)
    k_pos = j * size + jnp.arange(size)
    causal = k_pos[None, :] <= q_pos[:, None]
    mask = causal[None] & (k_doc[:, None, :] == q_doc[:, :, None])
    return jnp.where(mask[:, None, None], s, _NEG)


def _forward_block(q_i, q_doc_i, i, k, v, k_doc, size):
    """Online softmax of one query block over the key blocks: (out f32, lse f32)."""
    b, _, kv, g, d = q_i.shape
    m0 = jnp.full((b, kv, g, size), _NEG, jnp.float32)
    l0 = jnp.zeros((b, kv, g, size), jnp.float32)
    acc0 = jnp.zeros((b, kv, g, size, d), jnp.float32)

    def visit(carry, j):
        m, total, acc = carry
        s = _scores(q_i, k[j], q_doc_i, k_doc[j], i, j, size)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - safe[..., None])
        scale = jnp.exp(jnp.where(jnp.isfinite(m), m - safe, _NEG))
        pv = jnp.einsum(
            "bkgqs,bskd->bkgqd", p.astype(v.dtype), v[j], preferred_element_type=jnp.float32
        )
        return (m_new, total * scale + jnp.sum(p, axis=-1), acc * scale[..., None] + pv)

    m, total, acc = jax.lax.fori_loop(0, i + 1, lambda j, c: visit(c, j), (m0, l0, acc0))
    seen = total > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, total, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, total, 1.0)), jnp.inf)
    return out, lse


def _prepare(q, k, v, doc, size):
    """Padded, grouped and blocked operands."""
    batch, length, heads, dim = q.shape
    kv = k.shape[2]
    padded = -(-length // size) * size
    q = q.reshape(batch, length, kv, heads // kv, dim)
    q, k, v = (_pad_to(x, padded) for x in (q, k, v))
    q_doc = _pad_to(doc, padded, -1)  # padded queries and keys match nothing real
    k_doc = _pad_to(doc, padded, -2)
    return tuple(_blocks(x, size) for x in (q, k, v, q_doc, k_doc))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, doc, size):
    return _flash_fwd(q, k, v, doc, size)[0]


def _flash_fwd(q, k, v, doc, size):
    batch, length, heads, dim = q.shape
    qb, kb, vb, q_doc, k_doc = _prepare(q, k, v, doc, size)

    def per_query_block(_, xs):
        q_i, q_doc_i, i = xs
        return None, _forward_block(q_i, q_doc_i, i, kb, vb, k_doc, size)

    _, (out, lse) = jax.lax.scan(per_query_block, None, (qb, q_doc, jnp.arange(qb.shape[0])))
    # out: [n, B, KV, G, bq, D] -> [B, T, H, D]
    out = jnp.moveaxis(out, 4, 2)  # [n, B, bq, KV, G, D]
    out = _unblocks(out)[:, :length].reshape(batch, length, heads, dim).astype(q.dtype)
    return out, (q, k, v, doc, out, lse)


def _flash_bwd(size, residuals, d_out):
    q, k, v, doc, out, lse = residuals
    batch, length, heads, dim = q.shape
    kv = k.shape[2]
    qb, kb, vb, q_doc, k_doc = _prepare(q, k, v, doc, size)
    grouped = lambda x: x.reshape(batch, length, kv, heads // kv, dim)  # noqa: E731
    do = grouped(d_out)
    # D_i = sum_d dO_id O_id: the softmax backward's row term, per query.
    delta = jnp.sum(do.astype(jnp.float32) * grouped(out).astype(jnp.float32), axis=-1)
    dob, deltab = (
        _blocks(_pad_to(do, qb.shape[0] * size), size),
        _blocks(_pad_to(delta, qb.shape[0] * size), size),
    )
    dk0 = jnp.zeros_like(kb, jnp.float32)
    dv0 = jnp.zeros_like(vb, jnp.float32)

    def per_query_block(carry, xs):
        q_i, q_doc_i, lse_i, do_i, delta_i, i = xs

        def visit(c, j):
            dq, dk, dv = c
            s = _scores(q_i, kb[j], q_doc_i, k_doc[j], i, j, size)
            p = jnp.exp(s - lse_i[..., None])  # masked scores are -inf: p = 0
            dv_j = jnp.einsum("bkgqs,bqkgd->bskd", p.astype(do_i.dtype), do_i,
                              preferred_element_type=jnp.float32)  # fmt: skip
            dp = jnp.einsum("bqkgd,bskd->bkgqs", do_i, vb[j], preferred_element_type=jnp.float32)
            ds = p * (dp - jnp.moveaxis(delta_i, 1, -1)[..., None]) * (q_i.shape[-1] ** -0.5)
            ds = ds.astype(q_i.dtype)
            dq = dq + jnp.einsum("bkgqs,bskd->bqkgd", ds, kb[j], preferred_element_type=jnp.float32)
            dk_j = jnp.einsum("bkgqs,bqkgd->bskd", ds, q_i, preferred_element_type=jnp.float32)
            return dq, dk.at[j].add(dk_j), dv.at[j].add(dv_j)

        dq0 = jnp.zeros_like(q_i, jnp.float32)
        dq, dk, dv = jax.lax.fori_loop(0, i + 1, lambda j, c: visit(c, j), (dq0, *carry))
        return (dk, dv), dq

    # lse is stacked per query block as [n, B, KV, G, bq], the layout of the scores
    xs = (qb, q_doc, lse, dob, deltab, jnp.arange(qb.shape[0]))
    (dk, dv), dq = jax.lax.scan(per_query_block, (dk0, dv0), xs)
    dq = _unblocks(dq)[:, :length].reshape(batch, length, heads, dim)
    dk = _unblocks(dk)[:, :length]
    dv = _unblocks(dv)[:, :length]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, doc: jax.Array, block_size: int = 512
) -> jax.Array:
    """Causal, document-masked self-attention computed block by block.

    Same result as `attend(q, k, v, q_slot=arange, k_slot=arange, q_doc=doc, k_doc=doc)`
    without the `[T, T]` score matrix.

    Args:
        q: [B, T, H, D] queries (scaled here by D^-0.5).
        k, v: [B, T, KV, D] keys and values of the same positions; H is a multiple of KV.
        doc: int[B, T] document index of each position (attend only within a document).
        block_size: query and key block length; T is padded up to a multiple of it.

    Returns:
        [B, T, H, D] in q's dtype; the softmax accumulates in float32.
    """
    if k.shape[1] != q.shape[1] or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"flash_attention is self-attention: q {q.shape}, k {k.shape}, v {v.shape} must "
            "share batch and length (k and v also heads)"
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} are not a multiple of kv heads {k.shape[2]}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    size = min(block_size, q.shape[1])
    return _flash(q, k, v, doc.astype(jnp.int32), size)
