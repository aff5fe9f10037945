"""Mixture of experts: softmax top-k router, SwiGLU experts, the gated shared expert, and
three interchangeable dropless dispatches.

    p = softmax(x W_router)            (float32)
    top-k experts and weights of p     (renormalised to sum 1 if `norm_topk_prob`)
    y = sum_k w_k * down_e(silu(gate_e x) * up_e x)  [+ sigmoid(x w_sg) * shared(x)]

Dispatches (config `moe_dispatch`), all exact and dropless:
- "dense": every expert on every token, combined with a sparse weight matrix. E/k times the
  FLOPs; the reference.
- "sorted": assignments sorted by expert, then a loop over row blocks of `moe_block_size`
  runs each expert's MLP on its own rows with its weights read in place
  (`models._grouped_mlp`); about 1 + E b / (2 N k) times the useful FLOPs; fastest on CPU.
- "capacity": assignments sorted by expert into an [E, capacity] grid (capacity =
  `moe_capacity_factor` x the mean rows per expert) and run as one batched matmul per
  projection with the weights read in place; an expert's rows past its capacity go through
  the block loop of "sorted" (usually none). Fastest on CPU when routing is near balanced.
- "ragged": assignments sorted by expert and fed to `jax.lax.ragged_dot` (grouped GEMM
  kernels on GPU/TPU; slow on CPU).
The router statistics for the load-balancing loss are returned alongside.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import _params as P
from models._config import QwenConfig
from models._grouped_mlp import gathered_swiglu, grouped_swiglu, plan_blocks
from models._moe_sharded import expert_parallel_experts, shard_local_experts


def _swiglu(h: jax.Array) -> jax.Array:
    """silu(gate) * up for h [..., 2, F] (gate and up stacked on the second-to-last axis)."""
    return P.silu(h[..., 0, :]) * h[..., 1, :]


def dense_experts(x, idx, weights, gate_up, down):
    """x [N, D], idx/weights [N, K], gate_up [E, D, 2, F], down [E, F, D] -> [N, D]."""
    num_experts = gate_up.shape[0]
    combine = jnp.sum(jax.nn.one_hot(idx, num_experts, dtype=x.dtype) * weights[..., None], 1)
    h = _swiglu(jnp.einsum("nd,edgf->negf", x, gate_up))
    y = jnp.einsum("nef,efd->ned", h, down)
    return jnp.einsum("ne,ned->nd", combine, y)


def _sort_assignments(idx: jax.Array, num_experts: int):
    """Assignments (token, k) sorted by expert: (order, sorted experts, per-expert counts)."""
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1, mode="drop")
    return order, flat[order], counts


@jax.custom_vjp
def _take_rows(x: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """`x[index]` for a row gather whose every use of a row is listed in `inverse`.

    Args:
        x: [R, D]; index: int[M] rows of x, value R reads a zero row.
        inverse: int[R, U], for each row of x the output positions that read it (value M:
            unused slot).

    The backward pass is then a gather too (dx[r] = sum_j dout[inverse[r, j]]) instead of a
    scatter-add into a materialised zero buffer, which is what costs on CPU.
    """
    return _with_zero_row(x)[index]


def _with_zero_row(x: jax.Array) -> jax.Array:
    return jnp.concatenate([x, jnp.zeros((1, *x.shape[1:]), x.dtype)])


def _take_rows_fwd(x, index, inverse):
    return _take_rows(x, index, inverse), inverse


def _take_rows_bwd(inverse, dout):
    return jnp.sum(_with_zero_row(dout)[inverse], axis=1), None, None


_take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def sorted_experts(x, idx, weights, gate_up, down, *, block_size: int):
    """Assignments sorted by expert, each expert's MLP run on its own rows; same contract as
    `dense_experts`.

    The (token, k) assignments are sorted by expert (a permutation: nothing is padded or
    dropped) and `models._grouped_mlp.grouped_swiglu` runs each expert on its rows in
    blocks of `block_size`. Both row gathers have gather transposes (`_take_rows`).
    """
    n, k = idx.shape
    order, _, counts = _sort_assignments(idx, gate_up.shape[0])
    order = order.astype(jnp.int32)
    position = jnp.zeros((n * k,), jnp.int32).at[order].set(jnp.arange(n * k, dtype=jnp.int32))
    xs = _take_rows(x, order // k, position.reshape(n, k))
    plan = plan_blocks(counts, block_size, n * k)
    ys = grouped_swiglu(xs, gate_up, down, plan, block_size)
    y = _take_rows(ys, position, order[:, None]).reshape(n, k, -1)
    # Rows of assignments to no expert here (index E) are never computed: weight 0, no grad.
    weights = jnp.where(idx < gate_up.shape[0], weights, 0)
    return jnp.einsum("nk,nkd->nd", weights, y)


def gathered_experts(x, idx, weights, gate_up, down, *, block_size: int):
    """Like `sorted_experts`, but rows are gathered from `x` block by block and summed into
    the tokens' outputs (`models._grouped_mlp.gathered_swiglu`): no [N K, D] buffer, nothing
    per row kept for the backward pass. An expert index of E (= gate_up.shape[0]) marks an
    assignment to no expert here: it is sorted last and never visited (expert parallelism).
    """
    n, k = idx.shape
    order, _, counts = _sort_assignments(idx, gate_up.shape[0])
    order = order.astype(jnp.int32)
    pad = jnp.zeros((block_size,), jnp.int32)
    token = jnp.concatenate([order // k, pad])
    weight = jnp.concatenate([weights.reshape(-1)[order], pad.astype(weights.dtype)])
    plan = plan_blocks(counts, block_size, n * k)
    return gathered_swiglu(x, token, weight, gate_up, down, plan, block_size).astype(x.dtype)


def expert_capacity(rows: int, num_experts: int, factor: float) -> int:
    """Rows per expert of the "capacity" grid: `factor` x the mean, rounded up to a multiple
    of 8, at most `rows` (all assignments at one expert)."""
    mean = factor * rows / num_experts
    return max(1, min(rows, -(-math.ceil(mean) // 8) * 8))


def capacity_experts(x, idx, weights, gate_up, down, *, capacity_factor: float,
                     block_size: int, num_experts: int | None = None):  # fmt: skip
    """Assignments sorted by expert into an [E, capacity] grid and run as batched matmuls;
    same contract as `dense_experts`, dropless.

    Slot j of expert e holds the j-th assignment to e (in token order); empty slots read a
    zero row and contribute nothing. Assignments past an expert's capacity are run by
    `gathered_experts`, whose block loop visits only the blocks those overflow rows need
    (none when every expert fits). `num_experts` is the model's expert count (the capacity
    is a multiple of the mean over all of them); it differs from gate_up.shape[0] only when
    the experts here are one device's share (expert parallelism), where index
    gate_up.shape[0] marks an assignment to no expert here.
    """
    n, k = idx.shape
    local, hidden, _, ffn = gate_up.shape
    cap = expert_capacity(n * k, num_experts or local, capacity_factor)
    order, sorted_expert, counts = _sort_assignments(idx, local)
    order = order.astype(jnp.int32)
    start = jnp.cumsum(counts) - counts
    # Rank of each sorted row among its expert's rows; rows of no expert here sort last.
    here = sorted_expert < local
    rank = jnp.arange(n * k, dtype=jnp.int32) - jnp.take(start, sorted_expert, mode="clip")
    fits = here & (rank < cap)
    slot = jnp.where(fits, sorted_expert * cap + rank, local * cap)
    position = jnp.zeros((n * k,), jnp.int32).at[order].set(slot)  # grid slot of (token, k)
    j = jnp.arange(cap, dtype=jnp.int32)
    filled = j < counts[:, None]
    assignment = jnp.where(filled, order[jnp.minimum(start[:, None] + j, n * k - 1)], n * k)
    assignment = assignment.reshape(-1)  # (token, k) of each slot; n k: empty
    token = jnp.where(assignment < n * k, assignment // k, n)
    xs = _take_rows(x, token, position.reshape(n, k)).reshape(local, cap, hidden)
    # Gate and up as one [D, 2F] matrix per expert (a 3-D batched matmul runs faster on CPU).
    h = jnp.einsum("ecd,edf->ecf", xs, gate_up.reshape(local, hidden, 2 * ffn))
    h = _swiglu(h.reshape(local, cap, 2, ffn))
    ys = jnp.einsum("ecf,efd->ecd", h, down).reshape(local * cap, hidden)
    y = _take_rows(ys, position, assignment[:, None]).reshape(n, k, hidden)
    weights = jnp.where(idx < local, weights, 0)
    out = jnp.einsum("nk,nkd->nd", weights, y)
    # Assignments past their expert's capacity (no grid slot) through the gathered block
    # loop; every other assignment is "not here" to it and never visited.
    overflow = (position.reshape(n, k) == local * cap) & (idx < local)
    extra = gathered_experts(
        x, jnp.where(overflow, idx, local), weights, gate_up, down, block_size=block_size
    )
    return out + extra


def ragged_experts(x, idx, weights, gate_up, down):
    """`jax.lax.ragged_dot` grouped matmul; same contract as `dense_experts`."""
    n, k = idx.shape
    num_experts, hidden, _, ffn = gate_up.shape
    order, _, counts = _sort_assignments(idx, num_experts)
    xs = x[order // k]  # rows past sum(counts) (expert index E: none here) come out zero
    h = jax.lax.ragged_dot(xs, gate_up.reshape(num_experts, hidden, 2 * ffn), counts)
    h = _swiglu(h.reshape(-1, 2, ffn))
    ys = jax.lax.ragged_dot(h, down, counts)
    y = jnp.zeros_like(ys).at[order].set(ys).reshape(n, k, -1)
    return jnp.einsum("nk,nkd->nd", weights, y)


def route(logits: jax.Array, top_k: int, normalize: bool) -> tuple[jax.Array, ...]:
    """Softmax router: (probs f32[N, E], top-k weights f32[N, K], top-k indices int[N, K])."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top_w, top_i = jax.lax.top_k(probs, top_k)
    if normalize:
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)
    return probs, top_w, top_i


class MoE(nnx.Module):
    """Routed SwiGLU experts plus, for Qwen3.5, the sigmoid-gated shared expert."""

    def __init__(self, config: QwenConfig):
        c = config.resolved()  # "auto" dispatch made concrete for this backend
        self.config = c
        pd = P.to_dtype(c.param_dtype)
        std = c.initializer_range
        e, x, f = c.hidden_size, c.num_experts, c.moe_intermediate_size

        def normal(shape, names):
            return P.normal(shape, names, std=std, dtype=pd)

        # SwiGLU gate and up projections are stacked on an unnamed axis of size 2 (HF's fused
        # `gate_up_proj` layout), so each runs as one matmul.
        self.router = normal((e, x), (P.EMBED, P.EXPERT))
        self.gate_up_proj = normal((x, e, 2, f), (P.EXPERT, P.EMBED, None, P.MLP))
        self.down_proj = normal((x, f, e), (P.EXPERT, P.MLP, P.EMBED))
        s = c.shared_expert_intermediate_size
        if s:
            self.shared_gate_up_proj = normal((e, 2, s), (P.EMBED, None, P.MLP))
            self.shared_down_proj = normal((s, e), (P.MLP, P.EMBED))
            self.shared_expert_gate = normal((e,), (P.EMBED,))

    def _experts(self, x, idx, weights):
        c = self.config
        gate_up = self.gate_up_proj[...].astype(x.dtype)
        down = self.down_proj[...].astype(x.dtype)
        if c.moe_dispatch == "dense":
            dispatch = dense_experts
        elif c.moe_dispatch == "sorted":
            # Expert-parallel: the gathered token axis is the whole expert group's, so the
            # memory-lean variant (no [N K, D] rows) of the same block loop.
            fn = gathered_experts if c.moe_expert_parallel else sorted_experts
            dispatch = functools.partial(fn, block_size=c.moe_block_size)
        elif c.moe_dispatch == "capacity":
            dispatch = functools.partial(
                capacity_experts,
                capacity_factor=c.moe_capacity_factor,
                block_size=c.moe_block_size,
                num_experts=c.num_experts,
            )
        else:
            dispatch = ragged_experts
        if c.moe_expert_parallel:  # experts run where they are stored; tokens travel
            return expert_parallel_experts(dispatch, x, idx, weights, gate_up, down)
        if c.moe_shard_local:  # each data-parallel shard sorts only its own tokens
            return shard_local_experts(dispatch, x, idx, weights, gate_up, down)
        return dispatch(x, idx, weights, gate_up, down)

    def _project(self, x: jax.Array) -> tuple[jax.Array, ...]:
        """Router logits, and the shared expert's gate logit and gate/up, in one matmul."""
        c = self.config
        kernels = [self.router[...]]
        if c.shared_expert_intermediate_size:
            kernels += [self.shared_expert_gate[...][:, None], self.shared_gate_up_proj[...]]
        flat = [w.reshape(w.shape[0], -1).astype(x.dtype) for w in kernels]
        sizes = [w.shape[1] for w in flat]
        y = x @ jnp.concatenate(flat, axis=1)
        return tuple(jnp.split(y, [sum(sizes[:i]) for i in range(1, len(sizes))], axis=-1))

    def __call__(self, x: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x [B, T, E], valid bool[B, T] -> (y [B, T, E], expert counts f32[E], prob sums f32[E]).

        The statistics count valid (non-padding) tokens only and feed the load-balancing loss.
        """
        c = self.config
        batch, length, hidden = x.shape
        flat = x.reshape(-1, hidden)
        parts = self._project(flat)
        probs, top_w, top_i = route(parts[0], c.num_experts_per_tok, c.norm_topk_prob)
        y = self._experts(flat, top_i, top_w.astype(x.dtype))
        if c.shared_expert_intermediate_size:
            _, shared_gate, gate_up = parts
            h = _swiglu(gate_up.reshape(-1, 2, c.shared_expert_intermediate_size))
            shared = h @ self.shared_down_proj[...].astype(x.dtype)
            y = y + jax.nn.sigmoid(shared_gate) * shared
        mask = valid.reshape(-1).astype(jnp.float32)
        counts = jnp.einsum("nke,n->e", jax.nn.one_hot(top_i, c.num_experts), mask)
        prob_sums = jnp.einsum("ne,n->e", probs, mask)
        return y.reshape(batch, length, hidden), counts, prob_sums
