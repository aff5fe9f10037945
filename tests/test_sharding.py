"""Mesh construction, logical-axis resolution, sharded init and batch placement."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from hat_jax import sharding
from hat_jax.sharding import (
    ACTIVATION_RULES,
    PARAM_RULES,
    SAMPLING_RULES,
    MeshConfig,
    UnknownAxisError,
    logical_to_spec,
)


def test_mesh_config_fills_the_minus_one_axis_and_rejects_bad_sizes():
    assert MeshConfig(fsdp=-1, tensor=2).shape(8) == {
        "data": 1,
        "fsdp": 4,
        "expert": 1,
        "tensor": 2,
    }
    assert MeshConfig(data=2, fsdp=4).shape(8)["fsdp"] == 4
    with pytest.raises(ValueError, match="needs 16 devices, but 8"):
        MeshConfig(data=2, fsdp=8).shape(8)
    with pytest.raises(ValueError, match="not divisible"):
        MeshConfig(fsdp=-1, tensor=3).shape(8)
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="unknown axes"):
        MeshConfig.from_dict({"model": 2})
    mesh = sharding.make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2))
    assert mesh.axis_names == sharding.MESH_AXES and dict(mesh.shape)["tensor"] == 2
    one = sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    assert one.devices.size == 1


def test_logical_to_spec_skips_used_trivial_and_indivisible_axes():
    mesh = sharding.make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2))
    # expert weights: whole experts per device (expert x fsdp), so embed is left unsplit
    spec = logical_to_spec(("layers", "expert", "embed", "mlp"), PARAM_RULES, mesh, (4, 8, 64, 32))
    assert spec == P(None, ("expert", "fsdp"), None, "tensor")
    # 2 experts do not divide over expert x fsdp (4): expert only, embed takes fsdp
    spec = logical_to_spec(("layers", "expert", "embed", "mlp"), PARAM_RULES, mesh, (4, 2, 64, 32))
    assert spec == P(None, "expert", "fsdp", "tensor")
    # a dense weight's embed takes fsdp and expert together
    assert logical_to_spec(("embed", "q_heads"), PARAM_RULES, mesh, (64, 4)) == P(
        ("fsdp", "expert"), "tensor"
    )
    # one kv head cannot be split over tensor=2: replicated rather than padded
    assert logical_to_spec(("embed", "kv_heads"), PARAM_RULES, mesh, (64, 1)) == P(
        ("fsdp", "expert"), None
    )
    # an embed of 6 divides by fsdp (2) but not by fsdp x expert (4)
    assert logical_to_spec(("embed",), PARAM_RULES, mesh, (6,)) == P("fsdp")
    # size-1 axes vanish
    flat = sharding.make_mesh(MeshConfig(fsdp=8))
    assert logical_to_spec(("vocab", "embed"), PARAM_RULES, flat) == P(None, "fsdp")
    assert logical_to_spec(("batch", "seq"), ACTIVATION_RULES, mesh) == P(("fsdp", "expert"), None)
    assert logical_to_spec(("embed", "mlp"), SAMPLING_RULES, mesh) == P(None, "tensor")
    with pytest.raises(UnknownAxisError, match="logical axis 'heads_typo'"):
        logical_to_spec(("heads_typo",), PARAM_RULES, mesh)


def test_every_model_axis_name_has_a_rule_in_every_table():
    from models import AXIS_NAMES

    for table in (PARAM_RULES, ACTIVATION_RULES, SAMPLING_RULES):
        missing = set(AXIS_NAMES) - {name for name, _ in table}
        assert not missing, f"no rule for {missing}"


def _linear():
    return nnx.Linear(64, 16, rngs=nnx.Rngs(3), kernel_metadata={"out_sharding": ("embed", "mlp")})


def test_init_sharded_creates_shards_directly_with_mesh_independent_values():
    mesh = sharding.make_mesh(MeshConfig(fsdp=4, tensor=2))
    model = sharding.init_sharded(_linear, mesh)
    kernel = model.kernel.get_value()
    assert kernel.sharding.spec == P("fsdp", "tensor")
    assert {s.data.shape for s in kernel.addressable_shards} == {(16, 8)}
    single = sharding.init_sharded(
        _linear, sharding.make_mesh(MeshConfig(), devices=jax.devices()[:1])
    )
    np.testing.assert_array_equal(np.asarray(kernel), np.asarray(single.kernel.get_value()))
    graphdef, abstract = sharding.abstract_model(_linear, mesh)
    assert isinstance(abstract["kernel"].get_value(), jax.ShapeDtypeStruct)
    assert abstract["kernel"].get_value().sharding.spec == P("fsdp", "tensor")


def test_constrain_is_a_no_op_without_a_mesh_and_pins_layouts_under_one():
    x = jnp.ones((8, 4))
    assert sharding.constrain(x, ("batch", "embed")) is x
    mesh = sharding.make_mesh(MeshConfig(fsdp=8))
    with jax.set_mesh(mesh):
        y = jax.jit(lambda a: sharding.constrain(a * 2, ("batch", "embed")))(x)
    assert y.sharding.spec[0] == "fsdp" and y.sharding.spec[1:] in ((), (None,))


def test_global_batch_lays_rows_over_the_data_parallel_axes():
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    assert sharding.data_parallel_size(mesh) == 4
    batch = sharding.global_batch({"input_ids": np.arange(64).reshape(8, 8)}, mesh)
    assert batch["input_ids"].sharding.spec == P(("data", "fsdp"), None)
    with pytest.raises(ValueError, match="not divisible by the data-parallel size 4"):
        sharding.global_batch({"input_ids": np.zeros((6, 8))}, mesh)


def test_distributed_environment_detection(monkeypatch):
    for var in (
        "JAX_COORDINATOR_ADDRESS",
        "SLURM_JOB_ID",
        "SLURM_NTASKS",
        "TPU_WORKER_HOSTNAMES",
        "OMPI_MCA_orte_hnp_uri",
        "OMPI_COMM_WORLD_SIZE",
    ):
        monkeypatch.delenv(var, raising=False)
    assert sharding.distributed_environment() is None
    assert sharding.initialize_distributed() is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert sharding.distributed_environment() is None, "a one-task SLURM job is one process"
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert sharding.distributed_environment() == "slurm"
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    assert sharding.distributed_environment() == "coordinator"
    with pytest.raises(RuntimeError, match="JAX_NUM_PROCESSES, JAX_PROCESS_ID"):
        sharding.initialize_distributed()
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "0")
    for bad in ("soon", "0"):
        monkeypatch.setenv("HAT_JAX_HEARTBEAT_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match=f"HAT_JAX_HEARTBEAT_TIMEOUT_S='{bad}'"):
            sharding.initialize_distributed()


def test_process_rows_takes_this_process_consecutive_share(monkeypatch):
    rows = {"ids": np.arange(12).reshape(6, 2), "lengths": np.arange(6)}
    assert sharding.process_rows(rows) is rows  # one process: everything
    assert sharding.all_process_rows(rows)["lengths"].tolist() == list(range(6))
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    mine = sharding.process_rows(rows)
    assert mine["lengths"].tolist() == [2, 3] and mine["ids"].tolist() == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="4 minibatch rows do not split over 3 processes"):
        sharding.process_rows({"ids": np.zeros((4, 2))}, what="minibatch rows")
    with pytest.raises(ValueError, match=r"different row counts \[2, 3\]"):
        sharding.process_rows({"a": np.zeros(3), "b": np.zeros(2)})


def test_fingerprint_tells_values_shapes_and_dtypes_apart():
    from hat_jax.sharding._processes import fingerprint

    base = fingerprint([np.arange(4, dtype=np.int32)])
    assert base == fingerprint([np.arange(4, dtype=np.int32)])
    assert base != fingerprint([np.arange(4, dtype=np.int64)])
    assert base != fingerprint([np.arange(4, dtype=np.int32).reshape(2, 2)])
    assert base != fingerprint([np.asarray([0, 1, 2, 4], np.int32)])
    sharding.check_same_on_all_processes([np.arange(3)], "one process")  # nothing to compare
