"""The keys of a training batch: the contract between the data pipeline and the trainer.

Every batch a `hat_jax.train.DataSource` yields (the Grain pipeline in `data/`, the on-policy
sources of OPD, RL and MTP) is a dict of int32 `[b, T]` arrays with exactly these keys (their
meaning: `hat_jax.train._data`). A module of its own, free of JAX, so that `data` reads it
without importing the trainer; `data` and `hat_jax.train` both re-export it.
"""

BATCH_KEYS = ("input_ids", "loss_mask", "segment_ids", "positions")
