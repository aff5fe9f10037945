"""The device mesh: four named axes built from a config, on one host or many.

Axes, outermost first: `data` (pure data parallel: parameters replicated), `fsdp` (data
parallel with parameters, gradients and optimiser state sharded), `expert` (MoE experts
sharded; data parallel elsewhere) and `tensor` (attention heads, MLP width and vocabulary
sharded). The order puts the axis with the most traffic (`tensor`) on the closest devices.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

MESH_AXES = ("data", "fsdp", "expert", "tensor")

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Sizes of the mesh axes; one of them may be -1 to take all remaining devices.

    Attributes:
      data: replicas that hold a full copy of the (non-FSDP) parameters.
      fsdp: devices that shard parameters, gradients and optimiser state.
      expert: devices that shard the MoE experts.
      tensor: devices that shard heads, MLP width and vocabulary.
    """

    data: int = 1
    fsdp: int = -1
    expert: int = 1
    tensor: int = 1

    def __post_init__(self):
        sizes = self.as_dict()
        bad = {k: v for k, v in sizes.items() if v == 0 or v < -1}
        if bad:
            raise ValueError(f"MeshConfig: axis sizes must be positive or -1, got {bad}")
        if list(sizes.values()).count(-1) > 1:
            raise ValueError(f"MeshConfig: at most one axis may be -1, got {sizes}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> MeshConfig:
        unknown = sorted(set(values) - set(MESH_AXES))
        if unknown:
            raise ValueError(f"MeshConfig: unknown axes {unknown}; the axes are {MESH_AXES}")
        return cls(**{k: int(v) for k, v in values.items()})

    def as_dict(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in MESH_AXES}

    def shape(self, num_devices: int) -> dict[str, int]:
        """The axis sizes for `num_devices` devices, with the -1 axis filled in."""
        sizes = self.as_dict()
        known = math.prod(v for v in sizes.values() if v != -1)
        if -1 in sizes.values():
            if num_devices % known:
                raise ValueError(
                    f"MeshConfig {sizes}: {num_devices} devices are not divisible by the fixed "
                    f"axes' product {known}"
                )
            sizes = {k: (num_devices // known if v == -1 else v) for k, v in sizes.items()}
        if math.prod(sizes.values()) != num_devices:
            raise ValueError(
                f"MeshConfig {sizes} needs {math.prod(sizes.values())} devices, "
                f"but {num_devices} are available"
            )
        return sizes


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A mesh over `devices` (default: all global devices) with the four named axes.

    Axes are `Auto` (GSPMD): programs state input and output shardings and XLA propagates
    the rest.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = config.shape(len(devices))
    shape = tuple(sizes[axis] for axis in MESH_AXES)
    axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    if len(devices) == jax.device_count() and devices == list(jax.devices()):
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types)
    return jax.sharding.Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)


def _int_env(name: str) -> int:
    try:
        return int(os.environ.get(name, "1"))
    except ValueError:
        return 1


def distributed_environment() -> str | None:
    """The multi-process launcher this process runs under, or None for a single process.

    Recognised: an explicit coordinator (`JAX_COORDINATOR_ADDRESS`, e.g. set by a Kubernetes
    JobSet), SLURM with more than one task, Open MPI with more than one rank, and multi-host
    Cloud TPU VMs.
    """
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return "coordinator"
    if "SLURM_JOB_ID" in os.environ and _int_env("SLURM_NTASKS") > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in os.environ and _int_env("OMPI_COMM_WORLD_SIZE") > 1:
        return "ompi"
    if len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
        return "tpu"
    return None


HEARTBEAT_ENV = "HAT_JAX_HEARTBEAT_TIMEOUT_S"


def initialize_distributed() -> str | None:
    """Calls `jax.distributed.initialize()` when a multi-process environment is detected.

    Safe to call in every launch script: on a single process it does nothing. JAX reads the
    coordinator, process count and process id from the environment it detects. When a
    process dies, the coordinator notices its missing heartbeats and stops every other
    process with an error naming the lost one (instead of leaving them waiting in a
    collective): after `HAT_JAX_HEARTBEAT_TIMEOUT_S` seconds (JAX's default, 100, if unset).

    Raises:
      RuntimeError / ValueError: an incomplete coordinator environment, or a timeout that is
        not a positive integer.

    Returns:
      The detected environment's name, or None.
    """
    env = distributed_environment()
    if env is None:
        return None
    if jax.distributed.is_initialized():
        return env
    _log.info("multi-process environment detected (%s): initialising jax.distributed", env)
    kwargs: dict[str, Any] = {}
    if env == "coordinator":
        missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if v not in os.environ]
        if missing:
            raise RuntimeError(
                f"JAX_COORDINATOR_ADDRESS is set but {', '.join(missing)} is not: set all three"
            )
        kwargs = {
            "coordinator_address": os.environ["JAX_COORDINATOR_ADDRESS"],
            "num_processes": int(os.environ["JAX_NUM_PROCESSES"]),
            "process_id": int(os.environ["JAX_PROCESS_ID"]),
        }
    if heartbeat := os.environ.get(HEARTBEAT_ENV):
        if not heartbeat.isdigit() or int(heartbeat) < 1:
            raise ValueError(f"{HEARTBEAT_ENV}={heartbeat!r}: a positive number of seconds")
        kwargs["heartbeat_timeout_seconds"] = int(heartbeat)
    jax.distributed.initialize(**kwargs)
    _log.info(
        "process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return env
