"""The training core every stage shares.

A `TrainState` pytree; `make_train_step(loss_fn)` — one jitted, sharded step with exact
token-weighted gradient accumulation, clipping, AdamW and a non-finite guard; the SFT loss;
the `Trainer` loop with hooks (metrics, evaluation, checkpoints, plots); `run_sft`, the whole
SFT stage as one call; the `DataSource` interface the loop consumes (and a synthetic source
for tests and benchmarks).
"""

from hat_jax.train._data import BATCH_KEYS, DataSource, SyntheticTokenSource
from hat_jax.train._losses import (
    chunked_cross_entropy,
    cross_entropy,
    next_token_targets,
    sft_loss,
    unembedding,
)
from hat_jax.train._optimizer import (
    OptimizerConfig,
    learning_rate_schedule,
    make_optimizer,
    weight_decay_mask,
)
from hat_jax.train._plan import GIB, MemoryPlan, plan_sft_step
from hat_jax.train._sft import SFTConfig, SFTResult, abstract_split, batch_shardings_for, run_sft
from hat_jax.train._state import TrainState, abstract_train_state, init_train_state, split_model
from hat_jax.train._step import LossFn, LossOutput, make_eval_step, make_train_step
from hat_jax.train._trainer import NonFiniteError, Trainer, TrainerConfig

__all__ = [
    "BATCH_KEYS",
    "GIB",
    "DataSource",
    "LossFn",
    "LossOutput",
    "MemoryPlan",
    "NonFiniteError",
    "OptimizerConfig",
    "SFTConfig",
    "SFTResult",
    "SyntheticTokenSource",
    "TrainState",
    "Trainer",
    "TrainerConfig",
    "abstract_split",
    "abstract_train_state",
    "batch_shardings_for",
    "chunked_cross_entropy",
    "cross_entropy",
    "init_train_state",
    "learning_rate_schedule",
    "make_eval_step",
    "make_optimizer",
    "make_train_step",
    "next_token_targets",
    "plan_sft_step",
    "run_sft",
    "sft_loss",
    "split_model",
    "unembedding",
    "weight_decay_mask",
]
