"""Supervised fine-tuning as one library call: `run_sft`, on the shared stage driver.

One model (the policy, every parameter trainable), the masked next-token cross-entropy
(`sft_loss`), a `DataSource` of packed rows, and the eval loss on held-out rows. HSA-SFT and
the Fixed-Harness ablation differ only in their data source.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from hat_jax.sharding import MeshConfig
from hat_jax.train._data import DataSource
from hat_jax.train._losses import sft_loss
from hat_jax.train._optimizer import OptimizerConfig
from hat_jax.train._stage import RANDOM, ModelSpec, StageConfig, StageDriver, StageResult
from hat_jax.train._trainer import TrainerConfig

SFTResult = StageResult


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

    @property
    def stage(self) -> StageConfig:
        return StageConfig(trainer=self.trainer, optimizer=self.optimizer, mesh=self.mesh)

    def loss(self):
        """The stage's loss function."""
        return functools.partial(
            sft_loss, aux_loss_coef=self.aux_loss_coef, logits_chunk=self.logits_chunk
        )


def sft_driver(
    config: SFTConfig,
    *,
    model_fn: Callable[[], nnx.Module],
    run_dir: os.PathLike | str,
    init_params: Callable[[Any], Any] | None = None,
    run_config: Mapping[str, Any] | None = None,
    model_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> StageDriver:
    """The SFT stage on the stage driver (see `run_sft` for the arguments)."""
    return StageDriver(
        config.stage,
        models=ModelSpec(build=model_fn, init=init_params or RANDOM),
        loss_fn=config.loss(),
        run_dir=run_dir,
        run_config=run_config,
        model_config=model_config,
        mesh=mesh,
    )


def run_sft(
    config: SFTConfig,
    *,
    model_fn: Callable[[], nnx.Module],
    data: DataSource,
    run_dir: os.PathLike | str,
    init_params: Callable[[Any], Any] | None = None,
    eval_data: Callable[[], Iterator[Mapping[str, Any]]] | None = None,
    model_evaluations: Sequence[Callable[[nnx.Module], Mapping[str, float]]] = (),
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
      model_evaluations: `model -> figures` run with the eval loss (every `eval_every`
        steps) on the model of the current state, e.g. `hat_jax.eval.tool_choice_evaluation`.
      run_config, model_config: JSON-serialisable configs saved with every checkpoint.
      mesh: overrides the mesh built from `config.mesh`.
    """
    driver = sft_driver(config, model_fn=model_fn, run_dir=run_dir, init_params=init_params,
                        run_config=run_config, model_config=model_config, mesh=mesh)  # fmt: skip
    evaluations = []
    if eval_data is not None:
        evaluations.append(
            driver.loss_evaluation(eval_data, max_batches=config.trainer.eval_batches)
        )
    for evaluate in model_evaluations:
        evaluations.append(lambda state, evaluate=evaluate: evaluate(driver.model(state)))
    return driver.run(data, evaluations)
