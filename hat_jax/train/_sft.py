"""Supervised fine-tuning as one library call: `run_sft`.

Builds the mesh, the abstract sharded model and train state, resumes from the run's newest
readable checkpoint or initialises (from `init_params`, e.g. converted Hugging Face weights
or an Orbax checkpoint, else the model's own random init, all directly in the sharded
layout), compiles the step for `sft_loss`, and runs the `Trainer`. HSA-SFT and the
Fixed-Harness ablation differ only in their data source.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding

from hat_jax.checkpoint import CheckpointManager
from hat_jax.metrics import METRICS_FILE, read_metrics
from hat_jax.sharding import (
    ACTIVATION_RULES,
    PARAM_RULES,
    MeshConfig,
    batch_spec,
    data_parallel_size,
    init_sharded,
    make_mesh,
    shardings_of,
    state_shardings,
)
from hat_jax.train._data import BATCH_KEYS, DataSource
from hat_jax.train._losses import sft_loss
from hat_jax.train._optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer
from hat_jax.train._state import TrainState, abstract_train_state, init_train_state
from hat_jax.train._step import make_eval_step, make_train_step
from hat_jax.train._trainer import Trainer, TrainerConfig

_log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Everything `run_sft` needs besides the model and the data.

    Attributes:
      trainer: loop schedule and batch geometry.
      optimizer: AdamW and its schedule.
      mesh: device mesh axis sizes.
      aux_loss_coef: weight of the MoE load-balancing loss (Qwen: `router_aux_loss_coef`).
      logits_chunk: > 0 computes the loss this many positions at a time (see `sft_loss`).
    """

    trainer: TrainerConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()
    aux_loss_coef: float = 0.0
    logits_chunk: int = 0


@dataclasses.dataclass(frozen=True)
class SFTResult:
    """Where a finished (or stopped) SFT run left things."""

    run_dir: pathlib.Path
    step: int
    checkpoint_dir: pathlib.Path | None
    metrics_path: pathlib.Path
    plots_dir: pathlib.Path
    final_metrics: dict[str, Any]
    resumed_from: int | None
    preempted: bool


def batch_shardings_for(mesh: jax.sharding.Mesh, keys=BATCH_KEYS) -> dict[str, NamedSharding]:
    """The shardings of a packed-token batch: rows over the data-parallel axes."""
    return {k: NamedSharding(mesh, batch_spec(mesh, 2, ACTIVATION_RULES)) for k in keys}


def abstract_split(model_fn: Callable[[], nnx.Module], mesh: jax.sharding.Mesh):
    """`(graphdef, params, model_state)` of the model as sharded shape structs."""
    with nnx.use_eager_sharding(False):
        graphdef, params, rest = nnx.split(nnx.eval_shape(model_fn), nnx.Param, ...)

    def attach(state):
        shardings = state_shardings(state, mesh, PARAM_RULES)
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
        )

    return graphdef, attach(params), attach(rest)


def _initial_state(model_fn, init_params, mesh, optimizer, seed, graphdef, abs_params, abs_rest):
    """A fresh train state; with `init_params`, random parameters are never computed."""
    if init_params is None:
        model = init_sharded(model_fn, mesh, PARAM_RULES)
    else:
        params = init_params(abs_params)

        def rest():  # XLA drops the unused parameter initialisers.
            with nnx.use_eager_sharding(False):
                return nnx.split(model_fn(), nnx.Param, ...)[2]

        model_state = jax.jit(rest, out_shardings=shardings_of(abs_rest))()
        model = nnx.merge(graphdef, params, model_state)
    return init_train_state(model, optimizer, mesh, seed=seed)[1]


def run_sft(
    config: SFTConfig,
    *,
    model_fn: Callable[[], nnx.Module],
    data: DataSource,
    run_dir: os.PathLike | str,
    init_params: Callable[[Any], Any] | None = None,
    eval_data: Callable[[], Iterator[Mapping[str, Any]]] | None = None,
    run_config: Mapping[str, Any] | None = None,
    model_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> SFTResult:
    """Runs (or resumes) SFT and returns where its outputs are.

    Args:
      config: the SFT config.
      model_fn: builds the model (`lambda: Qwen(cfg, rngs=nnx.Rngs(seed))`); only traced
        abstractly, or run inside one sharded jitted initialiser.
      data: the training batches (process-local rows; see `DataSource`).
      run_dir: the run directory (checkpoints, metrics, plots).
      init_params: `abstract_params -> params` for a fresh run (e.g. restore an Orbax
        checkpoint or stream Hugging Face weights into that layout); None keeps random init.
      eval_data: returns a fresh iterator of evaluation batches.
      run_config, model_config: JSON-serialisable configs saved with every checkpoint.
      mesh: overrides the mesh built from `config.mesh`.
    """
    run_dir = pathlib.Path(run_dir)
    mesh = mesh or make_mesh(config.mesh)
    tcfg = config.trainer
    dp = data_parallel_size(mesh)
    if (tcfg.batch_size // tcfg.micro_batches) % dp:
        raise ValueError(
            f"trainer.batch_size {tcfg.batch_size} / micro_batches {tcfg.micro_batches} is not "
            f"divisible by the data-parallel size {dp} of mesh {dict(mesh.shape)}"
        )
    graphdef, abs_params, abs_rest = abstract_split(model_fn, mesh)
    optimizer = make_optimizer(config.optimizer, abs_params)
    abstract = abstract_train_state(abs_params, abs_rest, optimizer, mesh)
    checkpoints = CheckpointManager(
        run_dir / CHECKPOINTS_DIR, keep=tcfg.keep_checkpoints, async_save=tcfg.async_checkpoints
    )
    restored = checkpoints.restore(abstract)
    if restored is not None:
        for step, error in restored.skipped:
            _log.warning("checkpoint %d was unreadable and set aside: %s", step, error)
        state: TrainState = restored.state
        if restored.data_state is not None:
            data.set_state(restored.data_state)
        _log.info("resumed from step %d", restored.step)
    else:
        state = _initial_state(
            model_fn, init_params, mesh, optimizer, tcfg.seed, graphdef, abs_params, abs_rest
        )
    loss_fn = functools.partial(
        sft_loss, aux_loss_coef=config.aux_loss_coef, logits_chunk=config.logits_chunk
    )
    shardings = shardings_of(abstract)
    batch_shardings = batch_shardings_for(mesh)
    step_fn = make_train_step(
        loss_fn,
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=shardings,
        batch_shardings=batch_shardings,
        micro_batches=tcfg.micro_batches,
        learning_rate_fn=learning_rate_schedule(config.optimizer),
    )
    eval_fn = make_eval_step(
        loss_fn, graphdef=graphdef, state_shardings=shardings, batch_shardings=batch_shardings
    )
    trainer = Trainer(
        step_fn=step_fn,
        state=state,
        data=data,
        mesh=mesh,
        config=tcfg,
        run_dir=run_dir,
        checkpoints=checkpoints,
        run_config=run_config,
        model_config=model_config,
        eval_fn=eval_fn,
        eval_data=eval_data,
    )
    if restored is not None:
        trainer.metrics.rewind(restored.step)
        trainer.last_saved = restored.step  # already on disk: resuming a finished run saves nothing
    try:
        trainer.run()
    finally:
        trainer.close()
    latest = checkpoints.latest_step()
    records = [r for r in read_metrics(run_dir) if "loss" in r]
    return SFTResult(
        run_dir=run_dir,
        step=trainer.step,
        checkpoint_dir=run_dir / CHECKPOINTS_DIR / str(latest) if latest is not None else None,
        metrics_path=run_dir / METRICS_FILE,
        plots_dir=run_dir / "plots",
        final_metrics=records[-1] if records else {},
        resumed_from=restored.step if restored is not None else None,
        preempted=trainer.preempted,
    )
