"""Memory plans: compile a train step ahead of time on a mesh and read XLA's memory analysis.

Nothing is allocated: the train state and the batch are `jax.ShapeDtypeStruct`s with
shardings, the step is lowered and compiled for the mesh (on simulated CPU devices when
planning for a cluster), and XLA's buffer assignment reports, per device, the bytes of the
arguments (the state and the batch), the outputs, the outputs aliased to donated arguments,
and the temporaries (activations, gradients, collectives' buffers). The step's peak is
`arguments + outputs - aliased + temporaries`. An on-policy stage also samples between steps:
its sampling program is compiled too, and that phase's peak is the resident train state
(frozen models included) plus the sampler's caches, temporaries and outputs; the caches'
own bytes per device (as the program lays them out: split by rows over the data-like mesh
axes) are reported apart.

The numbers are XLA's own for the backend that compiled (CPU here); a GPU compile fuses and
schedules differently, so treat them as a close estimate and keep a margin.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hat_jax.sharding import make_mesh
from hat_jax.train._sft import SFTConfig, sft_driver
from hat_jax.train._stage import StageDriver

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device memory of one compiled train step (bytes), and what it was compiled for."""

    mesh: dict[str, int]
    batch_size: int
    seq_len: int
    micro_batches: int
    params: int
    state_bytes: int
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    compile_seconds: float
    largest: tuple[tuple[str, int], ...] = ()
    sampling_temporaries: int = 0
    sampling_outputs: int = 0
    sampling_cache: int = 0

    @property
    def step_peak(self) -> int:
        """The train step's peak: its arguments (state, batch), outputs not aliased to the
        donated state, and temporaries."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    @property
    def sampling_peak(self) -> int:
        """An on-policy stage's sampling phase: the whole train state stays resident while
        the sampler's caches and temporaries (and its outputs) are live (0: no sampling)."""
        if not (self.sampling_temporaries or self.sampling_outputs):
            return 0
        return self.state_bytes + self.sampling_temporaries + self.sampling_outputs

    @property
    def peak(self) -> int:
        return max(self.step_peak, self.sampling_peak)

    def fits(self, device_bytes: float, reserve: float = 0.1) -> bool:
        """Whether the peak fits with `reserve` of the device kept free (runtime, fragmentation)."""
        return self.peak <= device_bytes * (1.0 - reserve)


_ITEMSIZE = {
    "f64": 8,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "bf16": 2,
    "f16": 2,
    "s8": 1,
    "u8": 1,
    "pred": 1,
}


def largest_buffers(hlo_text: str, count: int = 5) -> tuple[tuple[str, int], ...]:
    """The `count` largest array shapes in a compiled (per-device) HLO module, with bytes:
    where to look when a plan does not fit."""
    sizes = {}
    for m in re.finditer(r"\b(f64|f32|s32|u32|bf16|f16|s8|u8|pred)\[([0-9,]+)\]", hlo_text):
        dims = [int(d) for d in m.group(2).split(",") if d]
        sizes[m.group(0)] = math.prod(dims) * _ITEMSIZE[m.group(1)]
    return tuple(sorted(sizes.items(), key=lambda kv: -kv[1])[:count])


def _nbytes(tree) -> int:
    """Bytes per device of a tree of sharded shape structs (the largest shard of each)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
    return total


def _output_cache_bytes(lowered, compiled) -> int:
    """Bytes per device of the `cache` a sampling program returns (its decoding caches, laid
    out as the compiled program keeps them); 0 if its output has no `cache`."""
    shapes = getattr(lowered.out_info, "cache", None)
    if shapes is None:
        return 0
    shardings = compiled.output_shardings.cache
    total = 0
    for shape, sharding in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)):
        total += math.prod(sharding.shard_shape(shape.shape)) * jnp.dtype(shape.dtype).itemsize
    return total


def plan_stage_step(
    driver: StageDriver,
    *,
    sampler: Callable[[Any], Any] | None = None,
) -> MemoryPlan:
    """Compiles a stage's train step (and, for an on-policy stage, its sampling program) for
    the driver's mesh and returns the memory plan. Nothing is allocated.

    Args:
      driver: the stage (its models, loss, mesh and batch geometry); never started.
      sampler: `abstract stage module -> jax.stages.Lowered` of the sampling program (e.g.
        `models.Sampler(module.policy).lower(...)`), for on-policy stages.
    """
    state, batch = driver.abstract, driver.abstract_batch()
    t = driver.config.trainer
    start = time.perf_counter()
    compiled = driver.step_fn.lower(state, batch).compile()
    analysis = compiled.memory_analysis()
    sampling = {}
    if sampler is not None:
        lowered = sampler(driver.model(state))
        program = lowered.compile()
        memory = program.memory_analysis()
        sampling = dict(
            sampling_temporaries=int(memory.temp_size_in_bytes),
            sampling_outputs=int(memory.output_size_in_bytes - memory.alias_size_in_bytes),
            sampling_cache=_output_cache_bytes(lowered, program),
        )
    seconds = time.perf_counter() - start
    return MemoryPlan(
        mesh=dict(driver.mesh.shape),
        batch_size=t.batch_size,
        seq_len=t.seq_len,
        micro_batches=t.micro_batches,
        params=sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)),
        state_bytes=_nbytes(state),
        arguments=int(analysis.argument_size_in_bytes),
        outputs=int(analysis.output_size_in_bytes),
        aliased=int(analysis.alias_size_in_bytes),
        temporaries=int(analysis.temp_size_in_bytes),
        compile_seconds=seconds,
        largest=largest_buffers(compiled.as_text()),
        **sampling,
    )


def plan_sft_step(
    config: SFTConfig,
    model_fn: Callable[[], nnx.Module],
    *,
    devices: list[jax.Device] | None = None,
) -> MemoryPlan:
    """Compiles the SFT train step of `config` for its mesh and returns its memory plan.

    Args:
      config: the SFT config (its mesh, batch geometry, micro-batches and optimiser).
      model_fn: builds the model (only traced abstractly).
      devices: the devices of the mesh (default: all); simulated CPU devices work.
    """
    mesh = make_mesh(config.mesh, devices=devices)
    with tempfile.TemporaryDirectory() as scratch:
        return plan_stage_step(sft_driver(config, model_fn=model_fn, run_dir=scratch, mesh=mesh))
