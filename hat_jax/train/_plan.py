"""Memory plans: compile a train step ahead of time on a mesh and read XLA's memory analysis.

Nothing is allocated: the train state and the batch are `jax.ShapeDtypeStruct`s with
shardings, the step is lowered and compiled for the mesh (on simulated CPU devices when
planning for a cluster), and XLA's buffer assignment reports, per device, the bytes of the
arguments (the state and the batch), the outputs, the outputs aliased to donated arguments,
and the temporaries (activations, gradients, collectives' buffers). The peak is
`arguments + outputs - aliased + temporaries`.

The numbers are XLA's own for the backend that compiled (CPU here); a GPU compile fuses and
schedules differently, so treat them as a close estimate and keep a margin.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from hat_jax.sharding import make_mesh, shardings_of
from hat_jax.train._data import BATCH_KEYS
from hat_jax.train._losses import sft_loss
from hat_jax.train._optimizer import learning_rate_schedule, make_optimizer
from hat_jax.train._sft import SFTConfig, abstract_split, batch_shardings_for
from hat_jax.train._state import abstract_train_state
from hat_jax.train._step import make_train_step

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

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries

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
    graphdef, params, rest = abstract_split(model_fn, mesh)
    optimizer = make_optimizer(config.optimizer, params)
    state = abstract_train_state(params, rest, optimizer, mesh)
    shardings = batch_shardings_for(mesh)
    t = config.trainer
    batch = {
        k: jax.ShapeDtypeStruct((t.batch_size, t.seq_len), jnp.int32, sharding=shardings[k])
        for k in BATCH_KEYS
    }
    step = make_train_step(
        functools.partial(
            sft_loss, aux_loss_coef=config.aux_loss_coef, logits_chunk=config.logits_chunk
        ),
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=shardings_of(state),
        batch_shardings=shardings,
        micro_batches=t.micro_batches,
        learning_rate_fn=learning_rate_schedule(config.optimizer),
    )
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    seconds = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    return MemoryPlan(
        mesh=dict(mesh.shape),
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
    )
