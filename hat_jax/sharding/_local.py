"""Shard-local computation named by logical axes: `local_map`, a `jax.shard_map` for model code.

Some computations must not be left to GSPMD's propagation. The MoE dispatch is the case in
point: it sorts the (token, expert) assignments of its input, and under GSPMD with the batch
sharded, a sort over the flattened token axis becomes a *global* sort (every device gathers
and sorts every token's assignments), with buffers that grow with the global batch. Run per
shard with `local_map`, each device sorts only its own tokens and no data moves for it.

Model code names dimensions logically (`"moe_tokens"`, `"embed"`, None, ...); `local_map`
resolves the names with `current_rules()` on `current_mesh()` (the sharding context),
exactly like `constrain`, so mesh axis names stay in this package. Without a mesh, or when
the names resolve to no mesh axis at all (e.g. `SAMPLING_RULES` keeps `moe_tokens`
unsharded), it calls the function directly and GSPMD decides as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from hat_jax.sharding._rules import current_mesh, current_rules, logical_to_spec

Names = Sequence[str | None]


def local_map(
    fn: Callable[..., Any],
    in_names: Sequence[Names],
    out_names: Names | Sequence[Names],
    *,
    out_shapes: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """`fn` run once per shard, its arguments and outputs split by logical axis names.

    Args:
      fn: a function of arrays; it sees the local shards (the dimensions a name maps to mesh
        axes are split, all others whole). An argument whose names resolve to no mesh axis
        (e.g. all None) is gathered whole onto every device, and in the backward pass its
        gradient is summed over the devices. `fn` communicates only over the mesh axes
        `local_axes` gives it for a logical name (collectives over them are differentiable).
      in_names: one tuple of logical names (or None) per positional argument of `fn`.
      out_names: the names of `fn`'s output, or a sequence of them for a tuple output.
        An output must be split wherever the inputs it depends on were (each device
        computed it for its own shard).
      out_shapes: a function of the (global) arguments returning the global shape structs
        of the output(s); default `jax.eval_shape(fn, ...)`, which needs an `fn` without
        collectives (a collective's axis is unbound outside the map).

    Returns:
      A function with `fn`'s signature. Resolution uses the global shapes of the arguments
      (and of the outputs, from `jax.eval_shape`): mesh axes that do not divide a dimension
      are dropped, as in `logical_to_spec`.
    """
    tuple_out = bool(out_names) and not isinstance(out_names[0], str | None)

    def wrapped(*args):
        mesh = current_mesh()
        if mesh is None:
            return fn(*args)
        if len(args) != len(in_names):
            raise ValueError(f"local_map: {len(args)} arguments but {len(in_names)} name tuples")
        rules = current_rules()
        in_specs = tuple(
            logical_to_spec(n, rules, mesh, a.shape) for n, a in zip(in_names, args, strict=True)
        )
        if all(all(p is None for p in spec) for spec in in_specs):
            return fn(*args)
        shapes = out_shapes(*args) if out_shapes else jax.eval_shape(fn, *args)
        out_list = out_names if tuple_out else (out_names,)
        shape_list = shapes if tuple_out else (shapes,)
        out_specs = tuple(
            logical_to_spec(n, rules, mesh, s.shape)
            for n, s in zip(out_list, shape_list, strict=True)
        )
        mapped = jax.shard_map(
            fn,
            mesh=mesh,
            in_specs=in_specs,
            out_specs=out_specs if tuple_out else out_specs[0],
            # Model code inside (searchsorted's while loop, scans) is written for global
            # arrays, not for shard_map's per-axis variance types. Unchecked, the transpose
            # still sums the gradients of whole (unsplit) arguments over the devices.
            check_vma=False,
        )
        return mapped(*args)

    return wrapped


def local_axes(names: Names, shape: Sequence[int], dim: int = 0) -> tuple[str, ...]:
    """The mesh axes `local_map` splits dimension `dim` of an array named `names` over: the
    axis names for collectives inside `fn` (e.g. `jax.lax.all_gather(x, local_axes(...))`),
    so that model code never spells a mesh axis. Empty without a mesh or when unsplit."""
    spec = local_spec(names, shape)
    if spec is None or spec[dim] is None:
        return ()
    return (spec[dim],) if isinstance(spec[dim], str) else tuple(spec[dim])


def local_spec(names: Names, shape: Sequence[int] | None = None) -> PartitionSpec | None:
    """The `PartitionSpec` `local_map` would use for `names` under the active rules and mesh,
    or None without a mesh (for tests and diagnostics)."""
    mesh = current_mesh()
    return None if mesh is None else logical_to_spec(names, current_rules(), mesh, shape)
