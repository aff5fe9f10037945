"""Parameter creation with logical axis names, and the dtype helpers every layer shares.

Every parameter is an `nnx.Param` whose `out_sharding` metadata holds *logical* axis names
(never mesh axis names); `hat_jax.sharding` maps them to mesh axes. Flax eagerly shards a
variable that carries names when a mesh is active, so the names only turn into placements
under a mesh (with logical rules); without one the model builds plainly on the default device.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.core import meta
from flax.core import spmd as core_spmd

# Logical axis names used by the model's parameters (documented in models/__init__.py).
VOCAB = "vocab"
EMBED = "embed"
Q_HEADS = "q_heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
EXPERT = "expert"
LAYERS = "layers"
DELTA_K_HEADS = "delta_k_heads"
DELTA_V_HEADS = "delta_v_heads"
DELTA_K_DIM = "delta_k_dim"
DELTA_V_DIM = "delta_v_dim"
CONV_KERNEL = "conv_kernel"

AXIS_NAMES = (
    VOCAB,
    EMBED,
    Q_HEADS,
    KV_HEADS,
    HEAD_DIM,
    MLP,
    EXPERT,
    LAYERS,
    DELTA_K_HEADS,
    DELTA_V_HEADS,
    DELTA_K_DIM,
    DELTA_V_DIM,
    CONV_KERNEL,
)


def to_dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


def _eager_sharding() -> bool:
    """Shard at creation only under a mesh, and only if flax's eager sharding is on."""
    return meta.get_global_mesh() is not None and nnx.using_eager_sharding()


def param(value: jax.Array, names: Sequence[str | None], **metadata) -> nnx.Param:
    """An `nnx.Param` carrying logical axis `names` (one per dimension of `value`)."""
    if len(names) != value.ndim:
        raise ValueError(f"{len(names)} axis names {tuple(names)} for shape {value.shape}")
    return nnx.Param(value, out_sharding=tuple(names), eager_sharding=_eager_sharding(), **metadata)


def normal(
    shape: Sequence[int], names: Sequence[str | None], *, std: float, dtype: jnp.dtype
) -> nnx.Param:
    """A parameter to draw from Normal(0, std) (HF's `initializer_range` convention).

    It holds zeros until `initialize` draws every random parameter of a model at once:
    one random draw for the whole model compiles in well under a second, where one draw
    per parameter takes XLA tens of seconds to compile on CPU.
    """
    return param(jnp.zeros(tuple(shape), dtype), names, init=("normal", std))


def log_uniform(
    shape: Sequence[int], names: Sequence[str | None], *, low: float, high: float, dtype
) -> nnx.Param:
    """A parameter to set to log(U(low, high)) by `initialize` (DeltaNet's A_log)."""
    return param(jnp.zeros(tuple(shape), dtype), names, init=("log_uniform", low, high))


def initialize(module: nnx.Module, key: jax.Array) -> None:
    """Draws every parameter created by `normal` / `log_uniform` in `module`, in place."""
    variables = [
        v
        for _, v in sorted(nnx.iter_graph(module), key=lambda item: str(item[0]))
        if isinstance(v, nnx.Param) and "init" in v.get_metadata()
    ]
    specs = tuple(
        (v.get_metadata()["init"], tuple(v.get_value().shape), jnp.dtype(v.get_value().dtype).name)
        for v in variables
    )
    values = _draw(key, specs)
    for var, value in zip(variables, values):
        meta_ = var.get_metadata()
        if meta_.get("eager_sharding"):
            value = core_spmd.shard_value(
                value, meta_["out_sharding"], meta_.get("sharding_rules"), meta_.get("mesh")
            )
        var.set_value(value)


# Above this many parameters, draw each parameter from its own key (below: one flat draw).
_FLAT_DRAW_LIMIT = 1 << 27


def _transform(init: tuple, z: jax.Array) -> jax.Array:
    if init[0] == "normal":
        return z * init[1]
    return jnp.log(init[1] + (init[2] - init[1]) * z)


@functools.partial(jax.jit, static_argnums=1)
def _draw(key: jax.Array, specs: tuple) -> list[jax.Array]:
    """Random values for parameters described by static `specs` (init, shape, dtype).

    Small models: one flat normal and one flat uniform draw split into the shapes, which XLA
    compiles in well under a second (one draw per parameter takes it tens of seconds on CPU).
    Large models: one draw per parameter from `fold_in(key, i)`, so that under a sharded
    `jax.jit` each device generates only its own shards. Jitted on `specs`, so building the
    same structure again reuses the compiled draw.
    """
    sizes = [int(np.prod(shape)) for _, shape, _ in specs]
    if sum(sizes) > _FLAT_DRAW_LIMIT:
        out = []
        for i, (init, shape, dtype) in enumerate(specs):
            k = jax.random.fold_in(key, i)
            z = (jax.random.normal if init[0] == "normal" else jax.random.uniform)(k, shape)
            out.append(_transform(init, z).astype(dtype))
        return out
    k_normal, k_uniform = jax.random.split(key)
    normal_total = sum(n for n, (init, _, _) in zip(sizes, specs) if init[0] == "normal")
    flat = {
        "normal": jax.random.normal(k_normal, (normal_total,), jnp.float32),
        "log_uniform": jax.random.uniform(k_uniform, (sum(sizes) - normal_total,), jnp.float32),
    }
    offsets = {"normal": 0, "log_uniform": 0}
    out = []
    for (init, shape, dtype), size in zip(specs, sizes):
        z = flat[init[0]][offsets[init[0]] : offsets[init[0]] + size]
        offsets[init[0]] += size
        out.append(_transform(init, z).reshape(shape).astype(dtype))
    return out


def constant(
    shape: Sequence[int], names: Sequence[str | None], *, value: float, dtype: jnp.dtype
) -> nnx.Param:
    return param(jnp.full(tuple(shape), value, dtype), names)


def silu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)
