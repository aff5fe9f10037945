"""Placing models and batches on a mesh: shardings from logical names, sharded init, batches.

A model's parameters name their dimensions through NNX variable metadata (`sharding_names`,
stored as `out_sharding`). `state_shardings` turns those names into `NamedSharding`s with a
rule table; `abstract_model` gives the model's state as sharded `jax.ShapeDtypeStruct`s
without allocating anything; `init_sharded` runs the initialiser as one jitted program whose
outputs are born sharded, so no device ever holds the whole model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hat_jax.sharding._rules import ACTIVATION_RULES, PARAM_RULES, Rules, logical_to_spec


def _path_str(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def logical_names(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names a variable carries, or None if it carries none."""
    metadata = variable.get_metadata()
    names = metadata.get("out_sharding") or metadata.get("sharding_names")
    return tuple(names) if names else None


def state_shardings(state: Any, mesh: jax.sharding.Mesh, rules: Rules = PARAM_RULES) -> Any:
    """`NamedSharding`s for every array of `state`, in the same tree structure.

    Args:
      state: an `nnx.State` (values may be arrays or `jax.ShapeDtypeStruct`s) or any pytree
        of arrays; arrays outside `nnx.Variable`s, and variables without logical names, are
        replicated.
      mesh: the device mesh.
      rules: the rule table mapping logical names to mesh axes.
    """

    def one(path, x):
        if isinstance(x, nnx.Variable):
            names, shape = logical_names(x), x.get_value().shape
            try:
                spec = logical_to_spec(names, rules, mesh, shape) if names else PartitionSpec()
            except (KeyError, ValueError) as err:
                raise type(err)(f"parameter '{_path_str(path)}': {err}") from err
            return x.replace(NamedSharding(mesh, spec))
        if hasattr(x, "shape"):
            return NamedSharding(mesh, PartitionSpec())
        return x

    return jax.tree_util.tree_map_with_path(
        one, state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )


def abstract_model(
    model_fn: Callable[[], nnx.Module], mesh: jax.sharding.Mesh, rules: Rules = PARAM_RULES
) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's graph and its state as sharded `jax.ShapeDtypeStruct`s; allocates nothing.

    Args:
      model_fn: builds the model, e.g. `lambda: Qwen(config, rngs=nnx.Rngs(seed))`.
      mesh: the device mesh the state will live on.
      rules: the parameter rule table.
    """
    with nnx.use_eager_sharding(False):
        abstract = nnx.eval_shape(model_fn)
    graphdef, state = nnx.split(abstract)
    return graphdef, sharded_structs(state, mesh, rules)


def sharded_structs(state: Any, mesh: jax.sharding.Mesh, rules: Rules = PARAM_RULES) -> Any:
    """A (possibly abstract) state as `jax.ShapeDtypeStruct`s with the `NamedSharding`s its
    variables' logical names ask for."""
    shardings = state_shardings(state, mesh, rules)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
    )


def shardings_of(abstract_state: Any) -> Any:
    """The `.sharding` of every leaf of an abstract (or concrete) state."""
    return jax.tree.map(lambda a: a.sharding, abstract_state)


def init_sharded(
    model_fn: Callable[[], nnx.Module], mesh: jax.sharding.Mesh, rules: Rules = PARAM_RULES
) -> nnx.Module:
    """Builds the model with every array created directly in its sharded layout.

    The initialiser runs as one `jax.jit` program with `out_shardings` from the rules, so each
    device computes only its own shards (random keys are partitionable: the values are the
    same on any mesh, and equal to an eager `model_fn()` up to float rounding).
    """
    graphdef, abstract = abstract_model(model_fn, mesh, rules)

    def init():
        with nnx.use_eager_sharding(False):
            return nnx.split(model_fn())[1]

    state = jax.jit(init, out_shardings=shardings_of(abstract))()
    return nnx.merge(graphdef, state)


def batch_spec(
    mesh: jax.sharding.Mesh, ndim: int, rules: Rules = ACTIVATION_RULES
) -> PartitionSpec:
    """The spec of a batch-major array: its first dimension over the `batch` rule's axes."""
    return logical_to_spec(("batch",) + (None,) * (ndim - 1), rules, mesh)


def data_parallel_size(mesh: jax.sharding.Mesh, rules: Rules = ACTIVATION_RULES) -> int:
    """How many ways the batch dimension is split on `mesh`."""
    axes = batch_spec(mesh, 1, rules)[0]
    if axes is None:
        return 1
    return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


def batch_shardings(
    batch: Mapping[str, Any], mesh: jax.sharding.Mesh, rules: Rules = ACTIVATION_RULES
) -> dict[str, NamedSharding]:
    """`NamedSharding`s for a dict batch (leading dimension over the data-parallel axes)."""
    return {k: NamedSharding(mesh, batch_spec(mesh, np.ndim(v), rules)) for k, v in batch.items()}


def global_batch(
    local_batch: Mapping[str, np.ndarray],
    mesh: jax.sharding.Mesh,
    rules: Rules = ACTIVATION_RULES,
) -> dict[str, jax.Array]:
    """Assembles each process's slice of a batch into global sharded arrays.

    Every process passes its own rows (`global rows / process count` of them); on one
    process that is the whole batch.
    """
    shardings = batch_shardings(local_batch, mesh, rules)
    dp = data_parallel_size(mesh, rules)
    out = {}
    for key, value in local_batch.items():
        value = np.asarray(value)
        rows = value.shape[0] * jax.process_count()
        if rows % dp:
            raise ValueError(
                f"batch '{key}': {rows} global rows are not divisible by the data-parallel size "
                f"{dp} of mesh {dict(mesh.shape)}"
            )
        out[key] = jax.make_array_from_process_local_data(shardings[key], value)
    return out
