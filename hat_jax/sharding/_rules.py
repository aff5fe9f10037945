"""Logical-axis rule tables: the only place where logical names meet mesh axis names.

Model code names the dimensions of its parameters and activations (`embed`, `mlp`, `expert`,
...). A rule table maps each logical name to mesh axes (`data`, `fsdp`, `expert`, `tensor`),
one mesh axis, or None (replicated). There are three tables because the same weights are laid
out differently by purpose:

- `PARAM_RULES`: training parameters (and with them gradients and optimiser state). Every
  weight is sharded over `fsdp` through its `embed` dimension; heads, MLP width and
  vocabulary over `tensor`. `embed` also takes `expert`, so that weights without an expert
  dimension are not replicated across the expert axis. Expert weights are split by expert
  over `expert` and `fsdp` (whole experts per device, their `embed` dimension then unsplit):
  the layout the expert-parallel dispatch computes in, so its weights never move.
- `ACTIVATION_RULES`: training activations: the batch over every data-like axis
  (`data`, `fsdp`, `expert`), heads / MLP width / vocabulary over `tensor`. `moe_tokens`
  (the token axis of a shard-local MoE dispatch, see `local_map`) splits over every axis,
  `tensor` included: each device routes its own slice of the tokens. `moe_experts` (the
  expert axis of the expert-parallel dispatch) splits like the expert weights are stored.
- `SAMPLING_RULES`: decoding, parameters and activations and caches together. No FSDP
  gathering per generated token: non-expert weights are replicated over `fsdp`, experts are
  spread over `expert` and `fsdp`, the batch over `data` and `fsdp`; `moe_tokens` is not
  split and `moe_experts` neither (decoding keeps the GSPMD dispatch over the sharded
  experts).

Resolution (`logical_to_spec`) skips mesh axes of size 1, mesh axes already used by an
earlier dimension of the same array, and — given the array's shape — mesh axes that do not
divide the dimension (e.g. 2 KV heads on a tensor axis of 4 are replicated, not padded).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import PartitionSpec

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]

_DATA_LIKE = ("data", "fsdp", "expert")

PARAM_RULES: Rules = (
    ("vocab", "tensor"),
    ("embed", ("fsdp", "expert")),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("heads", "tensor"),
    ("k_heads", "tensor"),
    ("v_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert_mlp", "tensor"),
    ("expert", ("expert", "fsdp")),
    ("layers", None),
    ("conv", None),
    ("conv_kernel", None),
    ("delta_k_heads", "tensor"),
    ("delta_v_heads", "tensor"),
    ("delta_k_dim", None),
    ("delta_v_dim", None),
    ("qkv", "tensor"),
    ("norm", None),
    ("unsharded", None),
)

ACTIVATION_RULES: Rules = (
    ("batch", _DATA_LIKE),
    ("seq", None),
    ("embed", None),
    ("vocab", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("heads", "tensor"),
    ("k_heads", "tensor"),
    ("v_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert_mlp", "tensor"),
    ("expert", "expert"),
    ("tokens", _DATA_LIKE),
    ("moe_tokens", (*_DATA_LIKE, "tensor")),
    ("moe_experts", ("expert", "fsdp")),
    ("layers", None),
    ("conv", None),
    ("conv_kernel", None),
    ("delta_k_heads", "tensor"),
    ("delta_v_heads", "tensor"),
    ("delta_k_dim", None),
    ("delta_v_dim", None),
    ("qkv", "tensor"),
    ("unsharded", None),
)

SAMPLING_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("cache_seq", None),
    ("embed", None),
    ("vocab", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("heads", "tensor"),
    ("k_heads", "tensor"),
    ("v_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert_mlp", "tensor"),
    ("expert", ("expert", "fsdp")),
    ("tokens", ("data", "fsdp")),
    ("moe_tokens", None),
    ("moe_experts", None),
    ("layers", None),
    ("conv", None),
    ("conv_kernel", None),
    ("delta_k_heads", "tensor"),
    ("delta_v_heads", "tensor"),
    ("delta_k_dim", None),
    ("delta_v_dim", None),
    ("qkv", "tensor"),
    ("norm", None),
    ("unsharded", None),
)


class UnknownAxisError(KeyError):
    """A logical axis name has no rule in the table used."""

    def __str__(self):
        return str(self.args[0])


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(
    names: Sequence[str | None],
    rules: Rules,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """The `PartitionSpec` for an array whose dimensions have the logical `names`.

    Args:
      names: one logical name (or None) per array dimension.
      rules: a rule table (`PARAM_RULES`, `ACTIVATION_RULES`, `SAMPLING_RULES` or your own).
      mesh: if given, mesh axes of size 1 are dropped (and `shape` can be checked).
      shape: the array's shape; mesh axes that do not divide a dimension are dropped.

    Raises:
      UnknownAxisError: a name has no rule.
    """
    if shape is not None and len(shape) != len(names):
        raise ValueError(f"logical names {tuple(names)} do not match shape {tuple(shape)}")
    table = dict(rules)
    sizes = dict(mesh.shape) if mesh is not None else {}
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise UnknownAxisError(
                f"logical axis '{name}' (dimension {dim} of {tuple(names)}) has no rule; "
                f"known: {sorted(table)}. Add it to the rule tables in hat_jax.sharding."
            )
        axes = [a for a in _as_tuple(table[name]) if a not in used and sizes.get(a, 2) > 1]
        if shape is not None and sizes:
            while axes and shape[dim] % math.prod(sizes[a] for a in axes):
                axes.pop()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


class _Context(threading.local):
    rules: Rules | None = None
    mesh: jax.sharding.Mesh | None = None


_CONTEXT = _Context()  # read and written only through the functions below


@contextlib.contextmanager
def use_rules(
    rules: Rules = ACTIVATION_RULES, mesh: jax.sharding.Mesh | None = None
) -> Iterator[None]:
    """Sets the activation rules (and the mesh) that `constrain` and `local_map` use inside
    this block, on this thread; the previous ones come back on exit.

    Usable while tracing: the compiled steps of `hat_jax.train` wrap their loss in it, so
    `constrain` calls in model and loss code pin activations on the step's mesh.
    """
    previous = (_CONTEXT.rules, _CONTEXT.mesh)
    _CONTEXT.rules, _CONTEXT.mesh = rules, mesh
    try:
        yield
    finally:
        _CONTEXT.rules, _CONTEXT.mesh = previous


def current_rules() -> Rules:
    """The activation rules set by `use_rules`, or `ACTIVATION_RULES`."""
    return _CONTEXT.rules if _CONTEXT.rules is not None else ACTIVATION_RULES


def current_mesh() -> jax.sharding.Mesh | jax.sharding.AbstractMesh | None:
    """The mesh activations are laid out on: the one set by `use_rules`, else the abstract
    mesh of `jax.set_mesh`, else None (one device, or no mesh: nothing to constrain)."""
    if _CONTEXT.mesh is not None:
        return _CONTEXT.mesh
    abstract = jax.sharding.get_abstract_mesh()
    if abstract.empty or not abstract.shape:
        return None
    return abstract


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Constrains an activation's sharding by the logical names of its dimensions.

    Uses `current_rules()` on `current_mesh()`; a no-op without a mesh, so model code can call
    it unconditionally: on one device it costs nothing, under a mesh it pins the layout XLA
    would otherwise have to guess (after gathers, reshapes, MoE dispatch).
    """
    mesh = current_mesh()
    if mesh is None:
        return x
    spec = logical_to_spec(names, current_rules(), mesh, x.shape)
    if isinstance(mesh, jax.sharding.Mesh):
        return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))
    return jax.lax.with_sharding_constraint(x, spec)
