"""Orbax checkpoints: parameter-only checkpoints (`save_params` / `restore_params`, shared with
`serve.convert`) and the training `CheckpointManager` (async, keep-N, train state + data
iterator state + config saved together, restore into abstract sharded state). `describe_mismatch`
is the one missing / unexpected / mis-shaped report, also used for HF directories."""

from hat_jax.checkpoint._manager import CheckpointManager, ProcessStates, Restored
from hat_jax.checkpoint._params import (
    CheckpointError,
    CheckpointMismatchError,
    describe_mismatch,
    read_model_config,
    restore_params,
    save_params,
)

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "ProcessStates",
    "Restored",
    "describe_mismatch",
    "read_model_config",
    "restore_params",
    "save_params",
]
