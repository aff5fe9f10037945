"""The train state: one pytree holding everything a step reads and writes.

`TrainState` carries the step counter, the trainable parameters and the model's other state,
the frozen state (models a stage only reads: a teacher, a reference policy, the policy under
an MTP head), the optimiser state, the RNG key (as raw key data, so checkpoints hold plain
integers) and the non-finite counters. A model is split three ways by filters
(`split_model`): trainable (`nnx.Param` by default), frozen (nothing by default) and the rest.
The model's graph definition is static and lives in the compiled step, not in the state.
Shardings of the optimiser state follow the parameters they mirror (matched by tree path),
everything else is replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from hat_jax.sharding import sharded_structs, shardings_of

Filter = Any  # an nnx filter: a Variable type, a path predicate, nnx.All / nnx.Not, ...


class TrainState(struct.PyTreeNode):
    """Everything a train step reads and writes; a pytree of arrays.

    Attributes:
      step: number of steps taken (int32 scalar), counting skipped ones.
      params: the trainable parameters (`nnx.State` of `nnx.Param`).
      model_state: the model's non-parameter state (often empty).
      opt_state: the optax state.
      rng: raw PRNG key data; the step derives its key from it and `step`.
      nonfinite_streak: consecutive steps skipped for a non-finite loss or gradient.
      nonfinite_total: all steps skipped so far.
      frozen: state the step reads but never differentiates, donates or checkpoints (None:
        none); it is read again from its source when a run resumes.
    """

    step: jax.Array
    params: Any
    model_state: Any
    opt_state: Any
    rng: jax.Array
    nonfinite_streak: jax.Array
    nonfinite_total: jax.Array
    frozen: Any = None


def split_model(
    model: nnx.Module, trainable: Filter = nnx.Param, frozen: Filter = nnx.Nothing
) -> tuple[nnx.GraphDef, nnx.State, nnx.State, nnx.State]:
    """`(graphdef, params, frozen, model_state)`: the trainable variables, the frozen ones and
    everything else. `frozen` is applied first, so a frozen model's parameters never train."""
    graphdef, frozen_state, params, rest = nnx.split(model, frozen, trainable, ...)
    return graphdef, params, frozen_state, rest


def merge_model(graphdef: nnx.GraphDef, state: TrainState) -> nnx.Module:
    """The model (or models) a train state holds, as one module."""
    parts = [state.params, state.model_state]
    if state.frozen is not None:
        parts.append(state.frozen)
    return nnx.merge(graphdef, *parts)


def abstract_parts(
    model_fn: Callable[[], nnx.Module],
    mesh: jax.sharding.Mesh,
    *,
    trainable: Filter = nnx.Param,
    frozen: Filter = nnx.Nothing,
) -> tuple[nnx.GraphDef, nnx.State, nnx.State, nnx.State]:
    """`split_model` of the model built by `model_fn`, as sharded shape structs; allocates
    nothing (`model_fn` is only traced)."""
    with nnx.use_eager_sharding(False):
        abstract = nnx.eval_shape(model_fn)
    graphdef, params, frozen_state, rest = split_model(abstract, trainable, frozen)
    return (graphdef, *(sharded_structs(s, mesh) for s in (params, frozen_state, rest)))


def abstract_split(model_fn: Callable[[], nnx.Module], mesh: jax.sharding.Mesh):
    """`(graphdef, params, model_state)` of the model as sharded shape structs (all of its
    `nnx.Param`s trainable)."""
    graphdef, params, _, rest = abstract_parts(model_fn, mesh)
    return graphdef, params, rest


def _keys(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _mirror_shardings(abstract_opt: Any, params_shardings: Any, mesh: jax.sharding.Mesh) -> Any:
    """Shardings for optimiser-state leaves: a parameter's, where the path ends with its path."""
    by_path = {
        _keys(path): sharding
        for path, sharding in jax.tree_util.tree_flatten_with_path(params_shardings)[0]
    }
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(path, leaf):
        keys = _keys(path)
        for start in range(len(keys)):
            sharding = by_path.get(keys[start:])
            if sharding is not None and len(sharding.spec) <= len(leaf.shape):
                return sharding
        return replicated

    return jax.tree_util.tree_map_with_path(one, abstract_opt)


def _scalar(value: int) -> jax.Array:
    return jnp.asarray(value, jnp.int32)


def abstract_train_state(
    params: Any,
    model_state: Any,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    frozen: Any = None,
) -> TrainState:
    """The train state as sharded `jax.ShapeDtypeStruct`s, from (abstract or real) model state.

    Nothing is allocated: use it to restore a checkpoint, to compile a step ahead of time, or
    as the `out_shardings` of the state's initialiser.
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    def sds(x, sharding=None):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or x.sharding)

    params = jax.tree.map(sds, params)
    model_state = jax.tree.map(sds, model_state)
    opt = jax.eval_shape(optimizer.init, params)
    opt = jax.tree.map(sds, opt, _mirror_shardings(opt, shardings_of(params), mesh))
    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    return TrainState(
        step=scalar,
        params=params,
        model_state=model_state,
        opt_state=opt,
        rng=jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated),
        nonfinite_streak=scalar,
        nonfinite_total=scalar,
        frozen=None if frozen is None else jax.tree.map(sds, frozen),
    )


def init_train_state(
    model: nnx.Module,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    seed: int,
    trainable: Filter = nnx.Param,
    frozen: Filter = nnx.Nothing,
) -> tuple[nnx.GraphDef, TrainState]:
    """The initial train state for an (already sharded) model; the optimiser state is created
    directly in the parameters' layout. `trainable` / `frozen` as in `split_model`."""
    graphdef, params, frozen_state, model_state = split_model(model, trainable, frozen)
    if not jax.tree.leaves(frozen_state):
        frozen_state = None
    abstract = abstract_train_state(params, model_state, optimizer, mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings_of(abstract.opt_state))(params)
    place = lambda x, s: jax.device_put(x, s)  # noqa: E731
    state = TrainState(
        step=place(_scalar(0), abstract.step.sharding),
        params=params,
        model_state=model_state,
        opt_state=opt_state,
        rng=place(jax.random.key_data(jax.random.key(seed)), abstract.rng.sharding),
        nonfinite_streak=place(_scalar(0), abstract.step.sharding),
        nonfinite_total=place(_scalar(0), abstract.step.sharding),
        frozen=frozen_state,
    )
    return graphdef, state
