"""Shard-local MoE dispatch: each data-parallel shard routes only its own tokens.

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
more tokens per step than that; it is not implemented here.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from hat_jax.sharding import local_map

_TOKENS = ("moe_tokens", None)
_WHOLE3 = (None, None, None)
_WHOLE4 = (None, None, None, None)


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
