"""Shard-local and expert-parallel MoE dispatch.

Shard-local (`shard_local_experts`, config `moe_shard_local`): each data-parallel shard
routes only its own tokens, against expert weights gathered whole.

Under GSPMD with the batch sharded, the dispatch's sort over the flattened token axis is a
global sort: every device gathers the expert assignments of every token in the global batch
and its buffers (the sorted rows, the block-gathered expert weights) grow with it — about
100 GiB of temporaries per device for Qwen3.6-35B-A3B at 8K tokens per device on 8 devices.
Here the dispatch runs inside `hat_jax.sharding.local_map` with the token axis named
`moe_tokens` (split over every mesh axis in training: data, fsdp, expert and tensor), so
each device sorts its own tokens, with buffers bounded by its own token count.

Expert weights enter whole on every device: XLA all-gathers them (in the compute dtype)
from their FSDP/expert-sharded storage once per layer, and in the backward pass their
gradient is summed over devices and scattered back to the parameters' shards. Why gather
weights rather than exchange tokens (all-to-all expert parallelism): at 8K tokens per device,
a layer's token exchange (8K x top-8 rows of 2K, there and back) moves about as many bytes as
the layer's expert weights (256 x 3 x 2K x 512), the gather needs no capacity factor to stay
dropless and static-shaped however unbalanced the routing, and it keeps every dispatch
(sorted / ragged / dense) unchanged inside. Exchanging tokens wins when a device holds many
more tokens per step than that.

Expert-parallel (`expert_parallel_experts`, config `moe_expert_parallel`): the expert
weights stay where they are stored, split by expert over the `moe_experts` mesh axes (the
expert group). Each device gathers the tokens (and routing) of its expert group, runs only
its own experts on the rows routed to them, and the partial outputs are reduce-scattered
back to the tokens' devices. What moves per layer is the group's tokens (there) and outputs
(back); the expert weights and their gradients never leave their device, so no device ever
holds a whole layer's experts or their f32 gradients, which is what bounds the memory of
full fine-tuning of a 256-expert model. Every dispatch works inside (assignments to other
devices' experts carry expert index E_local and weight 0); "gathered" is the memory-lean
one (no [tokens x top-k, hidden] buffers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from hat_jax.sharding import local_axes, local_map

_TOKENS = ("moe_tokens", None)
_WHOLE3 = (None, None, None)
_WHOLE4 = (None, None, None, None)
_EXPERTS3 = ("moe_experts", None, None)
_EXPERTS4 = ("moe_experts", None, None, None)


def shard_local_experts(
    dispatch: Callable[..., jax.Array],
    x: jax.Array,
    idx: jax.Array,
    weights: jax.Array,
    gate_up: jax.Array,
    down: jax.Array,
) -> jax.Array:
    """`dispatch(x, idx, weights, gate_up, down)` run per shard of the token axis.

    Args:
        dispatch: one of the dropless dispatches (`dense_experts`, `sorted_experts`, ...).
        x: [N, D] tokens; idx, weights: [N, K] routing; gate_up: [E, D, 2, F]; down: [E, F, D].

    Returns:
        [N, D], equal to `dispatch(...)` on the whole token axis (each token's output depends
        only on its own row). Without a mesh this is `dispatch` itself.
    """
    run = local_map(dispatch, (_TOKENS, _TOKENS, _TOKENS, _WHOLE4, _WHOLE3), _TOKENS)
    return run(x, idx, weights, gate_up, down)


def expert_parallel_experts(
    dispatch: Callable[..., jax.Array],
    x: jax.Array,
    idx: jax.Array,
    weights: jax.Array,
    gate_up: jax.Array,
    down: jax.Array,
) -> jax.Array:
    """`dispatch(x, idx, weights, gate_up, down)` with experts computed where they are stored.

    Args:
        dispatch: a dropless dispatch for which expert index E (one past the last expert it
            is given) means "not here" (`dense_experts`, `gathered_experts`, ...).
        x: [N, D] tokens; idx, weights: [N, K] routing; gate_up: [E, D, 2, F]; down: [E, F, D].

    Returns:
        [N, D], equal to `dispatch(...)` on the whole token axis with all experts. Without a
        mesh (or with experts unsplit) each device runs every expert on its own tokens.
    """
    group = local_axes(_EXPERTS4, gate_up.shape)
    per_shard = functools.partial(_exchange, dispatch, group)
    names = (_TOKENS, _TOKENS, _TOKENS, _EXPERTS4, _EXPERTS3)
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    run = local_map(per_shard, names, _TOKENS, out_shapes=lambda *_: shape)
    return run(x, idx, weights, gate_up, down)


def _gather_routing(group, idx, weights, local):
    """The group's routing, in this device's expert numbering (`local` marks "not here")."""
    if group:
        idx, weights = (jax.lax.all_gather(a, group, axis=0, tiled=True) for a in (idx, weights))
        idx = idx - jax.lax.axis_index(group) * local
    here = (idx >= 0) & (idx < local)
    return jnp.where(here, idx, local), jnp.where(here, weights, 0), here


def _exchange_forward(dispatch, group, x, idx, weights, gate_up, down):
    """One device's part: gather the group's tokens, run the local experts, reduce-scatter."""
    idx, weights, _ = _gather_routing(group, idx, weights, gate_up.shape[0])
    if group:
        x = jax.lax.all_gather(x, group, axis=0, tiled=True)
    y = dispatch(x, idx, weights, gate_up, down)
    return jax.lax.psum_scatter(y, group, scatter_dimension=0, tiled=True) if group else y


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _exchange(dispatch, group, x, idx, weights, gate_up, down):
    return _exchange_forward(dispatch, group, x, idx, weights, gate_up, down)


def _exchange_fwd(dispatch, group, x, idx, weights, gate_up, down):
    y = _exchange_forward(dispatch, group, x, idx, weights, gate_up, down)
    return y, (x, idx, weights, gate_up, down)


def _exchange_bwd(dispatch, group, residuals, dy):
    """Only this device's own tokens are kept for the backward pass. The group's tokens are
    gathered again together with the output gradients, in one collective whose result
    cannot be merged with the forward's gather (which would keep [group tokens, D] alive
    from a block's forward to its backward, for every layer of the block)."""
    x, idx, weights, gate_up, down = residuals
    idx, weights, here = _gather_routing(group, idx, weights, gate_up.shape[0])
    if group:
        both = jax.lax.all_gather(jnp.concatenate([x, dy.astype(x.dtype)], 1), group, tiled=True)
        x, dy = jnp.split(both, 2, axis=1)
    _, vjp = jax.vjp(lambda *a: dispatch(a[0], idx, *a[1:]), x, weights, gate_up, down)
    dx, d_weights, d_gate_up, d_down = vjp(dy)
    d_weights = jnp.where(here, d_weights, 0)  # other devices' assignments: their gradient
    if group:
        dx, d_weights = (jax.lax.psum_scatter(a, group, scatter_dimension=0, tiled=True)
                         for a in (dx, d_weights))  # fmt: skip
    return dx, None, d_weights, d_gate_up, d_down


_exchange.defvjp(_exchange_fwd, _exchange_bwd)
