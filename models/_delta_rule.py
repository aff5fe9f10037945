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

Inputs are float32 (the caller upcasts); q and k are expected L2-normalised and already
repeated to the value heads.
"""

from __future__ import annotations

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


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """(I + tril(a, -1))^-1 for a [..., n, n], by recursive block inversion.

    [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]], doubling the block size from 1
    to n (n is padded to a power of two). Only the strictly lower triangle of `a` is read.
    Only batched matmuls: on CPU about 50x faster than `triangular_solve` on many small
    systems, and the form GPU/TPU kernels use as well.
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
        corner = -lower @ lower_left @ upper
        top = jnp.concatenate([upper, jnp.zeros_like(upper)], axis=-1)
        bottom = jnp.concatenate([corner, lower], axis=-1)
        inv = jnp.concatenate([top, bottom], axis=-2)
        s *= 2
    return inv.reshape(*batch, size, size)[..., :n, :n]


@jax.custom_vjp
def solve_unit_lower(a: jax.Array, rhs: jax.Array) -> jax.Array:
    """(I + tril(a, -1))^-1 rhs for a [..., n, n] and rhs [..., n, m].

    Only the strictly lower triangle of `a` is read (its diagonal and upper part may hold
    anything). The backward pass reuses the forward inverse: with X = (I + a)^-1 rhs and
    G = (I + a)^-T dX, d rhs = G and d a = -tril(G X^T, -1) (two matmuls instead of
    differentiating the inversion).
    """
    return unit_lower_inverse(a) @ rhs


def _solve_fwd(a, rhs):
    inverse = unit_lower_inverse(a)
    x = inverse @ rhs
    return x, (inverse, x)


def _solve_bwd(residuals, dx):
    inverse, x = residuals
    g = jnp.swapaxes(inverse, -1, -2) @ dx
    n = inverse.shape[-1]
    strict = jnp.tril(jnp.ones((n, n), bool), -1)
    return jnp.where(strict, -(g @ jnp.swapaxes(x, -1, -2)), 0.0), g


solve_unit_lower.defvjp(_solve_fwd, _solve_bwd)


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
    """Chunked gated delta rule; same contract as `recurrent_gated_delta_rule`."""
    batch, length, heads, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    pad = (-length) % c
    # Padding continues the last segment with g = 0, beta = 0, k = 0: the state is unchanged.
    q, k, v, g, beta = (_pad_to_chunks(a, pad) for a in (q, k, v, g, beta))
    doc = _pad_to_chunks(doc, pad, mode="edge")
    n = (length + pad) // c
    q = q * (dk**-0.5)

    def chunks(a):  # [B, T, H, ...] -> [N, B, H, C, ...]: chunk-major, as the scan reads it
        a = a.reshape(batch, n, c, heads, *a.shape[3:])
        return jnp.moveaxis(a, (1, 3), (0, 2))

    q, k, v, g, beta = (chunks(a) for a in (q, k, v, g, beta))
    doc = jnp.moveaxis(doc.reshape(batch, 1, n, c), 2, 0)  # [N, B, 1, C]
    # The segment that was running before each chunk (the first chunk continues the state).
    prev_doc = jnp.concatenate([doc[:1, ..., :1], doc[:-1, ..., -1:]], axis=0)

    # Decays are exp of differences of one cumulative sum, taken only where both tokens are
    # in the same segment (elsewhere masked to 0). Within a segment the differences are <= 0;
    # clamping them keeps masked entries finite, so masks multiply instead of select. One
    # causal decay matrix serves both products: the solve reads only its strict lower part.
    cum = jnp.cumsum(g, axis=-1)  # [N, B, H, C]
    same = doc[..., :, None] == doc[..., None, :]  # [N, B, 1, C, C]
    mask = (same & jnp.tril(jnp.ones((c, c), bool))).astype(jnp.float32)
    decay = jnp.exp(jnp.minimum(cum[..., :, None] - cum[..., None, :], 0.0)) * mask

    cont = (doc == prev_doc).astype(jnp.float32)  # token still in the carried segment
    from_start = jnp.exp(cum) * cont  # [N, B, H, C] decay since the chunk start
    last_same = (doc == doc[..., -1:]).astype(jnp.float32)  # same segment as the chunk end
    to_end = jnp.exp(jnp.minimum(cum[..., -1:] - cum, 0.0)) * last_same
    chunk_decay = jnp.exp(cum[..., -1]) * cont[..., -1]  # [N, B, H]

    k_beta = k * beta[..., None]
    system = jnp.einsum("nbhik,nbhjk->nbhij", k_beta, k) * decay
    rhs = jnp.concatenate([v * beta[..., None], k_beta * from_start[..., None]], axis=-1)
    solved = solve_unit_lower(system, rhs)
    u, w = solved[..., :dv], solved[..., dv:]
    intra = jnp.einsum("nbhik,nbhjk->nbhij", q, k) * decay
    q_read = q * from_start[..., None]
    k_write = k * to_end[..., None]

    def step(state, xs):
        u_n, w_n, intra_n, q_n, k_n, decay_n = xs
        v_new = u_n - jnp.einsum("bhck,bhkv->bhcv", w_n, state)
        out = jnp.einsum("bhck,bhkv->bhcv", q_n, state)
        out = out + jnp.einsum("bhij,bhjv->bhiv", intra_n, v_new)
        state = state * decay_n[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", k_n, v_new)
        return state, out

    state = (
        jnp.zeros((batch, heads, dk, dv), jnp.float32) if initial_state is None else initial_state
    )
    xs = (u, w, intra, q_read, k_write, chunk_decay)
    state, out = jax.lax.scan(step, state, xs)  # out [N, B, H, C, Dv]
    out = jnp.moveaxis(out, (0, 2), (1, 3)).reshape(batch, n * c, heads, dv)[:, :length]
    return out, state
