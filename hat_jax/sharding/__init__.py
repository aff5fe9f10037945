"""Mesh and sharding: the only place in hat-jax where mesh axis names appear.

A mesh over (`data`, `fsdp`, `expert`, `tensor`) built from a `MeshConfig`; rule tables that
map the logical axis names parameters and activations carry to those mesh axes (one table for
training parameters, one for training activations, one for sampling); sharded initialisation
and batch placement; `local_map`, shard-local computation named by logical axes (the MoE
dispatch); multi-process start-up, and host rows across processes (`all_process_rows`,
`process_rows`, `to_host`: what on-policy sampling in a job of several processes needs).

The sharding context. Model and loss code never receives a mesh: it names dimensions, and
`constrain` / `local_map` (with `local_axes`, `local_spec`) resolve the names with
`current_rules()` on `current_mesh()`. That context is thread-local and set only by
`use_rules(rules, mesh)`, a `with` block: `hat_jax.train`'s compiled train and evaluation
steps (`_step.py`) trace the loss inside `use_rules(ACTIVATION_RULES, step_mesh)`. Without
it, the rules are `ACTIVATION_RULES` and the mesh is the one of `jax.set_mesh`, if any; with
no mesh, `constrain` is a no-op and `local_map` calls its function directly. Its readers: the
losses' `constrain` calls (`hat_jax.train._losses`) and the shard-local MoE dispatch
(`models._moe_sharded`, through `local_map` / `local_axes`).
"""

from hat_jax.sharding._local import local_axes, local_map, local_spec
from hat_jax.sharding._mesh import (
    MESH_AXES,
    MeshConfig,
    distributed_environment,
    initialize_distributed,
    make_mesh,
)
from hat_jax.sharding._placement import (
    abstract_model,
    batch_shardings,
    batch_spec,
    data_parallel_size,
    global_batch,
    init_sharded,
    logical_names,
    sharded_structs,
    shardings_of,
    state_shardings,
)
from hat_jax.sharding._processes import (
    all_process_rows,
    check_same_on_all_processes,
    process_rows,
    to_host,
)
from hat_jax.sharding._rules import (
    ACTIVATION_RULES,
    PARAM_RULES,
    SAMPLING_RULES,
    Rules,
    UnknownAxisError,
    constrain,
    current_mesh,
    current_rules,
    logical_to_spec,
    use_rules,
)

__all__ = [
    "ACTIVATION_RULES",
    "MESH_AXES",
    "PARAM_RULES",
    "SAMPLING_RULES",
    "MeshConfig",
    "Rules",
    "UnknownAxisError",
    "abstract_model",
    "all_process_rows",
    "batch_shardings",
    "batch_spec",
    "check_same_on_all_processes",
    "constrain",
    "current_mesh",
    "current_rules",
    "data_parallel_size",
    "distributed_environment",
    "global_batch",
    "init_sharded",
    "initialize_distributed",
    "local_axes",
    "local_map",
    "local_spec",
    "logical_names",
    "logical_to_spec",
    "make_mesh",
    "process_rows",
    "sharded_structs",
    "shardings_of",
    "state_shardings",
    "to_host",
    "use_rules",
]
