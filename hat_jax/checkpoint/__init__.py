"""Orbax checkpoints: parameter-only checkpoints (`save_params` / `restore_params`, shared with
`serve.convert`) and the training `CheckpointManager` (async, keep-N, train state + data
iterator state + config saved together, restore into abstract sharded state)."""

from hat_jax.checkpoint._manager import CheckpointManager, Restored
from hat_jax.checkpoint._params import (
    CheckpointError,
    CheckpointMismatchError,
    read_model_config,
    restore_params,
    save_params,
)

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "Restored",
    "read_model_config",
    "restore_params",
    "save_params",
]
