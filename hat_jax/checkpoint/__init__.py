"""Orbax checkpoints: parameter-only checkpoints (`save_params` / `restore_params`, shared with
`serve.convert`) and the training `CheckpointManager` (async, keep-N, train state + data
iterator state + config saved together, restore into abstract sharded state)."""

from hat_jax.checkpoint._params import (
    CheckpointError,
    read_model_config,
    restore_params,
    save_params,
)

__all__ = ["CheckpointError", "read_model_config", "restore_params", "save_params"]
