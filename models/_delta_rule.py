"""The gated delta rule, segment-aware: a chunked form for training and a per-step recurrence.

For each value head, with state S [Dk, Dv], decay g_t <= 0 (log space), beta_t in (0, 1):

    S <- exp(g_t) * S
    S <- S + k_t (beta_t (v_t - S^T k_t))^T
    o_t = S^T q_t                     (q_t scaled by Dk^-0.5)

and S <- 0 before the first token of every segment (packed sequences). The chunked form
(Yang et al., "Gated Delta Networks") processes C tokens at once: inside a chunk the
updates are condensed with the UT transform T = (I + tril(diag(beta) K K^T * Gamma, -1))^-1,
and only the state is carried from chunk to chunk. Segment boundaries inside a chunk mask
the pairwise terms and the reads and writes of the carried state; decays are differences of
one within-chunk cumulative sum, taken only between tokens of the same segment.

The chunked form has its own backward pass (`jax.custom_vjp`): the state gradient runs as
a reverse scan over chunks, everything else as batched matmuls over all chunks at once, and
both scans carry only the [Dk, Dv] state (their per-chunk terms are computed outside).

Inputs are float32 (the caller upcasts); q and k are expected L2-normalised and already
repeated to the value heads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def _start_mask(doc: jax.Array) -> jax.Array:
    """bool[B, T]: True where a token starts a new segment (never at t = 0: see below)."""
    return jnp.concatenate([jnp.zeros_like(doc[:, :1], bool), doc[:, 1:] != doc[:, :-1]], axis=1)


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    doc: jax.Array,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Token-by-token reference (and the decode step).

    Args:
        q, k: f32[B, T, H, Dk]; v: f32[B, T, H, Dv]; g, beta: f32[B, T, H].
        doc: int[B, T] segment index of each token; the state resets where it changes.
            The first token continues `initial_state` (zeros when None).
        initial_state: f32[B, H, Dk, Dv] or None.

    Returns:
        (o f32[B, T, H, Dv], final state f32[B, H, Dk, Dv]).
    """
    batch, _, heads, dk = k.shape
    dv = v.shape[-1]
    state = (
        jnp.zeros((batch, heads, dk, dv), jnp.float32) if initial_state is None else initial_state
    )
    keep = 1.0 - _start_mask(doc).astype(jnp.float32)
    q = q * (dk**-0.5)

    def step(s, inputs):
        q_t, k_t, v_t, g_t, b_t, keep_t = inputs
        s = s * (jnp.exp(g_t) * keep_t[:, None])[..., None, None]
        predicted = jnp.einsum("bhkv,bhk->bhv", s, k_t)
        delta = (v_t - predicted) * b_t[..., None]
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

    xs = [jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta, keep)]
    state, out = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(out, 0, 1), state


def _diagonal_blocks(a: jax.Array, s: int) -> jax.Array:
    """The lower-left s x s corners of the 2s x 2s diagonal blocks of a [..., n, n]: [..., m, s, s].

    Block i starts at flat index i 2s (n + 1), so one pad and reshapes pick all of them
    (a strided view; no gather).
    """
    batch, n = a.shape[:-2], a.shape[-1]
    m, stride = n // (2 * s), 2 * s * (n + 1)
    flat = a.reshape(*batch, n * n)
    flat = jnp.pad(flat, [(0, 0)] * len(batch) + [(0, m * stride - n * n)])
    rows = flat.reshape(*batch, m, stride)[..., : 2 * s * n].reshape(*batch, m, 2 * s, n)
    return rows[..., s:, :s]


def _tiny_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b as broadcast products and a sum: for blocks of a few rows, XLA's CPU backend
    runs this as one fused loop, while a batched matmul of thousands of 4 x 4 blocks costs
    more than all the larger blocks together."""
    return jnp.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """(I + tril(a, -1))^-1 for a [..., n, n], by recursive block inversion.

    [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]], doubling the block size from 1
    to n (n is padded to a power of two). Only the strictly lower triangle of `a` is read.
    Batched matmuls (blocks of up to 4 rows as fused products, `_tiny_matmul`): on CPU about
    50x faster than `triangular_solve` on many small systems, and the form GPU/TPU kernels
    use as well.
    """
    n = a.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()
    if size != n:
        a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, size - n), (0, size - n)])
    batch = a.shape[:-2]
    inv = jnp.ones((*batch, size, 1, 1), a.dtype)  # the 1 x 1 diagonal blocks
    s = 1
    while s < size:
        lower_left = _diagonal_blocks(a, s)  # [..., m, s, s]
        upper, lower = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        product = _tiny_matmul if s <= 4 else jnp.matmul
        corner = -product(product(lower, lower_left), upper)
        top = jnp.concatenate([upper, jnp.zeros_like(upper)], axis=-1)
        bottom = jnp.concatenate([corner, lower], axis=-1)
        inv = jnp.concatenate([top, bottom], axis=-2)
        s *= 2
    return inv.reshape(*batch, size, size)[..., :n, :n]


def _pad_to_chunks(x: jax.Array, pad: int, mode: str = "constant") -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, pad)
    return jnp.pad(x, widths, mode=mode)


def chunked_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    doc: jax.Array,
    *,
    chunk_size: int = 64,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Chunked gated delta rule; same contract as `recurrent_gated_delta_rule` (g <= 0).

    The chunk computation has a hand-written backward pass (`_chunk_rule`): the autodiff of
    the chunked form would keep and revisit many [C, C] intermediates per chunk; the
    explicit one is a reverse scan over the carried state plus batched matmuls.
    """
    batch, length, heads, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (-length) % c
    # Padding continues the last segment with g = 0, beta = 0, k = 0: the state is unchanged.
    q, k, v, g, beta = (_pad_to_chunks(a, pad) for a in (q, k, v, g, beta))
    doc = _pad_to_chunks(doc, pad, mode="edge")
    n = (length + pad) // c

    def chunks(a):  # [B, T, H, ...] -> [B, H, N, C, ...]: heads, then chunks, as batch axes
        a = a.reshape(batch, n, c, heads, *a.shape[3:])
        return jnp.moveaxis(a, 3, 1)

    q, k, v, g, beta = (chunks(a) for a in (q * (dk**-0.5), k, v, g, beta))
    doc = doc.reshape(batch, 1, n, c)
    state = (
        jnp.zeros((batch, heads, dk, dv), jnp.float32) if initial_state is None else initial_state
    )
    out, state = _chunk_rule(q, k, v, g, beta, doc, state)
    out = jnp.moveaxis(out, 1, 3).reshape(batch, n * c, heads, dv)[:, :length]
    return out, state


def _chunk_terms(g: jax.Array, doc: jax.Array) -> tuple[jax.Array, ...]:
    """Decay factors of the chunks, masked to the segments.

    Args:
        g: [B, H, N, C] log decays; doc: int[B, 1, N, C] segment indices.

    Returns:
        gamma [B, H, N, C, C]: exp(cum_i - cum_j) for j <= i in the same segment, else 0;
        start [B, H, N, C]: decay since the chunk start, 0 outside the carried segment;
        end [B, H, N, C]: decay to the chunk end, 0 outside the chunk's last segment;
        carry [B, H, N]: decay of the carried state over the chunk (0 if its segment ends).

    Decays are exp of differences of one within-chunk cumulative sum, taken only where both
    tokens are in the same segment; there the differences are <= 0, and clamping them keeps
    masked entries finite, so masks multiply instead of select.
    """
    c = g.shape[-1]
    # The segment running before each chunk (the first chunk continues the state).
    prev = jnp.concatenate([doc[:, :, :1, :1], doc[:, :, :-1, -1:]], axis=2)
    # A matmul with a triangular matrix rather than jnp.cumsum: XLA's CPU reduce-window
    # form gets re-fused into every decay consumer with slow indexing.
    cum = g @ jnp.triu(jnp.ones((c, c), g.dtype))
    same = (doc[..., :, None] == doc[..., None, :]) & jnp.tril(jnp.ones((c, c), bool))
    gamma = jnp.exp(jnp.minimum(cum[..., :, None] - cum[..., None, :], 0.0)) * same
    cont = (doc == prev).astype(jnp.float32)
    start = jnp.exp(cum) * cont
    last_same = (doc == doc[..., -1:]).astype(jnp.float32)
    end = jnp.exp(jnp.minimum(cum[..., -1:] - cum, 0.0)) * last_same
    return gamma, start, end, start[..., -1]


class _Saved(NamedTuple):
    """What the backward pass of `_chunk_rule` reads (chunk layout, see there)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    beta: jax.Array
    gamma: jax.Array  # [B, H, N, C, C]
    start: jax.Array
    end: jax.Array
    carry: jax.Array
    system: jax.Array  # (K_beta K^T) * gamma, [B, H, N, C, C]
    intra: jax.Array  # (Q K^T) * gamma, [B, H, N, C, C]
    inverse: jax.Array  # (I + tril(system, -1))^-1, [B, H, N, C, C]
    solved: jax.Array  # [U | W], [B, H, N, C, Dv + Dk]
    states: jax.Array  # the state entering each chunk, [B, H, N, Dk, Dv]
    v_new: jax.Array  # U - W S, [B, H, N, C, Dv]


def _chunk_forward(q, k, v, g, beta, doc, state) -> tuple[jax.Array, jax.Array, _Saved]:
    """Outputs, final state and what the backward pass reads; inputs as `_chunk_rule`'s."""
    dv = v.shape[-1]
    gamma, start, end, carry = _chunk_terms(g, doc)
    k_beta = k * beta[..., None]
    # UT transform: [U | W] = (I + tril(diag(beta) K K^T * gamma, -1))^-1 [beta V | beta K start].
    system = jnp.einsum("bhnik,bhnjk->bhnij", k_beta, k) * gamma
    inverse = unit_lower_inverse(system)
    solved = inverse @ jnp.concatenate([v * beta[..., None], k_beta * start[..., None]], -1)
    u, w = solved[..., :dv], solved[..., dv:]
    intra = jnp.einsum("bhnik,bhnjk->bhnij", q, k) * gamma
    k_end = k * end[..., None]
    # Across chunks S' = carry S + K_end^T (U - W S) = (carry I - K_end^T W) S + K_end^T U:
    # all but one [Dk, Dk] x [Dk, Dv] product per chunk is computed outside the scan.
    mix = jnp.einsum("bhnck,bhncj->nbhkj", k_end, w)
    add = jnp.einsum("bhnck,bhncv->nbhkv", k_end, u)

    def step(s, xs):
        mix_n, add_n, carry_n = xs
        return s * carry_n[..., None, None] - mix_n @ s + add_n, s

    final, states = jax.lax.scan(step, state, (mix, add, jnp.moveaxis(carry, 2, 0)))
    states = jnp.moveaxis(states, 0, 2)
    v_new = u - w @ states
    out = (q * start[..., None]) @ states + intra @ v_new
    saved = _Saved(
        q, k, v, beta, gamma, start, end, carry, system, intra, inverse, solved, states, v_new
    )
    return out, final, saved


@jax.custom_vjp
def _chunk_rule(q, k, v, g, beta, doc, state):
    """The chunked rule on chunk-major inputs.

    Args:
        q (scaled), k: [B, H, N, C, Dk]; v: [B, H, N, C, Dv]; g, beta: [B, H, N, C];
        doc: int[B, 1, N, C]; state: [B, H, Dk, Dv] before the first chunk.

    Returns:
        (o [B, H, N, C, Dv], final state [B, H, Dk, Dv]).
    """
    out, final, _ = _chunk_forward(q, k, v, g, beta, doc, state)
    return out, final


def _chunk_rule_fwd(q, k, v, g, beta, doc, state):
    out, final, saved = _chunk_forward(q, k, v, g, beta, doc, state)
    return (out, final), saved


def _state_grads(s: _Saved, k_end, d_out, d_final):
    """Gradients of the state after each chunk [B, H, N, Dk, Dv] and of the input state.

    With S' = carry S + K_end^T V_new, V_new = U - W S and O = Q_start S + intra V_new:
    dS = (carry I - W^T K_end) dS' + (Q_start - intra W)^T dO, a reverse scan whose
    carry-free parts are batched matmuls outside it.
    """
    w = s.solved[..., s.v.shape[-1] :]
    mix_t = jnp.einsum("bhncj,bhnck->nbhjk", w, k_end)
    read = s.q * s.start[..., None] - s.intra @ w
    add = jnp.einsum("bhnck,bhncv->nbhkv", read, d_out)

    def step(ds_next, xs):
        mix_n, add_n, carry_n = xs
        return ds_next * carry_n[..., None, None] - mix_n @ ds_next + add_n, ds_next

    xs = (mix_t, add, jnp.moveaxis(s.carry, 2, 0))
    d_state, d_after = jax.lax.scan(step, d_final, xs, reverse=True)
    return jnp.moveaxis(d_after, 0, 2), d_state


def _t(x: jax.Array) -> jax.Array:
    """x with its last two axes swapped, for a product that reads x transposed.

    XLA folds a transpose into the dot as a transposed left operand, which its CPU backend
    runs through a slower generic batched product (measured: 2.5 vs 1.4 ms for the chunk
    products here); on CPU a barrier keeps the transpose a copy of its own.
    """
    swap = lambda a: jnp.swapaxes(a, -1, -2)  # noqa: E731
    return jax.lax.platform_dependent(
        x, cpu=lambda a: jax.lax.optimization_barrier(swap(a)), default=swap
    )


def _chunk_rule_bwd(s: _Saved, cotangents):
    d_out, d_final = cotangents
    dv = s.v.shape[-1]
    k_end = s.k * s.end[..., None]
    d_after, d_state = _state_grads(s, k_end, d_out, d_final)

    # Through each chunk's outputs and state update.
    d_v_new = _t(s.intra) @ d_out + k_end @ d_after
    d_intra = jnp.einsum("bhniv,bhnjv->bhnij", d_out, s.v_new)
    d_q_start = jnp.einsum("bhncv,bhnkv->bhnck", d_out, s.states)
    d_k_end = jnp.einsum("bhncv,bhnkv->bhnck", s.v_new, d_after)
    d_carry = jnp.sum(s.states * d_after, axis=(-2, -1))
    d_w = -jnp.einsum("bhncv,bhnkv->bhnck", d_v_new, s.states)

    # Through the UT solve X = T rhs: d rhs = T^T dX and d system = -tril(d rhs X^T, -1).
    d_rhs = _t(s.inverse) @ jnp.concatenate([d_v_new, d_w], axis=-1)
    c = s.gamma.shape[-1]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    d_system = jnp.where(strict, -jnp.einsum("bhnim,bhnjm->bhnij", d_rhs, s.solved), 0.0)
    d_rhs_v, d_rhs_k = d_rhs[..., :dv], d_rhs[..., dv:]

    # system = (K_beta K^T) * gamma, intra = (Q K^T) * gamma, rhs = [beta V | K_beta start].
    k_beta = s.k * s.beta[..., None]
    d_kk, d_qk = d_system * s.gamma, d_intra * s.gamma
    d_k_beta = d_kk @ s.k + d_rhs_k * s.start[..., None]
    d_q = d_qk @ s.k + d_q_start * s.start[..., None]
    d_k = (
        _t(d_kk) @ k_beta
        + _t(d_qk) @ s.q
        + d_k_end * s.end[..., None]
        + d_k_beta * s.beta[..., None]
    )
    d_v = d_rhs_v * s.beta[..., None]
    d_beta = jnp.sum(d_rhs_v * s.v, axis=-1) + jnp.sum(d_k_beta * s.k, axis=-1)

    # Every decay is exp of a difference of the within-chunk cumulative sum of g.
    d_gamma = d_system * s.system + d_intra * s.intra  # d / d(cum_i - cum_j)
    d_start = jnp.sum(d_q_start * s.q, axis=-1) + jnp.sum(d_rhs_k * k_beta, axis=-1)
    d_end = jnp.sum(d_k_end * s.k, axis=-1) * s.end  # d / d(cum_last - cum_i)
    d_cum = jnp.sum(d_gamma, axis=-1) - jnp.sum(d_gamma, axis=-2) + d_start * s.start - d_end
    d_last = jnp.sum(d_end, axis=-1) + d_carry * s.carry
    d_cum = d_cum.at[..., -1].add(d_last)
    d_g = d_cum @ jnp.tril(jnp.ones((c, c), d_cum.dtype))  # sums over i >= j, as above
    return d_q, d_k, d_v, d_g, d_beta, None, d_state


_chunk_rule.defvjp(_chunk_rule_fwd, _chunk_rule_bwd)
