"""The training core every stage shares.

A `TrainState` pytree; `make_train_step(loss_fn)`, one jitted, sharded step with exact
token-weighted gradient accumulation, clipping, AdamW and a non-finite guard; the `Trainer`
loop with hooks (metrics, evaluation, checkpoints, plots, resume); `StageDriver`, the driver
every stage runs on (models with their sources, frozen or trained, a loss, a batch source,
evaluations); the SFT loss and `run_sft`; the batch-source interfaces (`DataSource`,
`OnPolicySource`) and a synthetic source for tests and benchmarks.

    result = run_stage(StageConfig(trainer=...), models=ModelSpec(build=...), loss_fn=...,
                       data=source, run_dir="runs/x")
"""

from hat_jax.train._data import (
    BATCH_KEYS,
    DataSource,
    OnPolicySource,
    SyntheticTokenSource,
    shared_state,
)
from hat_jax.train._losses import (
    chunked_cross_entropy,
    chunked_token_logprobs,
    cross_entropy,
    model_token_logprobs,
    next_token_targets,
    sft_loss,
    token_logprobs,
    unembedding,
)
from hat_jax.train._optimizer import (
    OptimizerConfig,
    learning_rate_schedule,
    make_optimizer,
    weight_decay_mask,
)
from hat_jax.train._plan import GIB, MemoryPlan, plan_sft_step, plan_stage_step
from hat_jax.train._sft import SFTConfig, SFTResult, run_sft, sft_driver
from hat_jax.train._stage import (
    RANDOM,
    Init,
    Models,
    ModelSpec,
    StageConfig,
    StageDriver,
    StageResult,
    batch_shardings_for,
    build_sharded,
    run_stage,
)
from hat_jax.train._state import (
    TrainState,
    abstract_parts,
    abstract_split,
    abstract_train_state,
    init_train_state,
    merge_model,
    split_model,
)
from hat_jax.train._step import LossFn, LossOutput, make_eval_step, make_train_step
from hat_jax.train._trainer import (
    Evaluation,
    NonFiniteError,
    Trainer,
    TrainerConfig,
    loss_evaluation,
)

__all__ = [
    "BATCH_KEYS",
    "GIB",
    "RANDOM",
    "DataSource",
    "Evaluation",
    "Init",
    "LossFn",
    "LossOutput",
    "MemoryPlan",
    "ModelSpec",
    "Models",
    "NonFiniteError",
    "OnPolicySource",
    "OptimizerConfig",
    "SFTConfig",
    "SFTResult",
    "StageConfig",
    "StageDriver",
    "StageResult",
    "SyntheticTokenSource",
    "TrainState",
    "Trainer",
    "TrainerConfig",
    "abstract_parts",
    "abstract_split",
    "abstract_train_state",
    "batch_shardings_for",
    "build_sharded",
    "chunked_cross_entropy",
    "chunked_token_logprobs",
    "cross_entropy",
    "init_train_state",
    "learning_rate_schedule",
    "loss_evaluation",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "merge_model",
    "model_token_logprobs",
    "next_token_targets",
    "plan_sft_step",
    "plan_stage_step",
    "run_sft",
    "run_stage",
    "sft_driver",
    "sft_loss",
    "shared_state",
    "split_model",
    "token_logprobs",
    "unembedding",
    "weight_decay_mask",
]
