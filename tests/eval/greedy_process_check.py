"""`hat_jax.eval.model_greedy_fn` as one process of a multi-process job: `python -m
tests.eval.greedy_process_check {same,diverge}`, started by `tests._devices.start_processes`.
The tiny model (`tests.rl.opd_check.model_config`) is built sharded over every process's
devices; `same` prints whether its parameters span other processes' devices and the argmax of
fixed random rows, `diverge` calls it with rows that differ on process 1 and prints the error.
"""

import json
import sys

import jax
import numpy as np
from flax import nnx

import models
from hat_jax import eval as hev
from hat_jax import sharding
from tests.rl import opd_check

if __name__ == "__main__":
    sharding.initialize_distributed()
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices())
    config = opd_check.model_config()
    model = sharding.init_sharded(lambda: models.Qwen(config, rngs=nnx.Rngs(0)), mesh)
    spans = any(not x.is_fully_addressable for x in jax.tree.leaves(nnx.state(model)))
    rows = np.random.default_rng(0).integers(0, config.vocab_size, (4, 40), dtype=np.int32)
    greedy_fn = hev.model_greedy_fn(model, bucket=16)
    if sys.argv[1] == "diverge":
        rows[0, 0] += jax.process_index()
        try:
            greedy_fn(rows)
        except RuntimeError as err:
            print(f"refused: {err}")
        sys.exit(0)
    print("spans processes:", spans)
    print("predicted:", json.dumps(greedy_fn(rows).tolist()))
