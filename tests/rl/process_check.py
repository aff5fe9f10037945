"""The shared small OPD and HSA-RL setups (`tests.rl.opd_check`, `tests.rl.rl_check`) as one
process of a multi-process job: `python -m tests.rl.process_check {opd,rl} RUN_DIR STEPS`,
started by `tests._devices.start_processes` (the coordinator, process count and id in the
environment), on a mesh over every process's devices. Checkpoints every step, so a run of
one process count can resume another's.

`python -m tests.rl.process_check diverge` instead calls the sampler with prompts that differ
between processes, and prints the error it raises.
"""

import sys

import jax

from hat_jax import sharding
from tests.rl import opd_check, rl_check


def diverge() -> None:
    from flax import nnx

    import models

    sampler = models.Sampler(models.Qwen(opd_check.model_config(), rngs=nnx.Rngs(0)))
    try:
        sampler([[1, 2, 3 + jax.process_index()]], max_new_tokens=2)
    except RuntimeError as err:
        print(f"refused: {err}")


if __name__ == "__main__":
    sharding.initialize_distributed()
    if sys.argv[1] == "diverge":
        diverge()
        sys.exit(0)
    stage, run_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices())
    check = {"opd": opd_check, "rl": rl_check}[stage]
    config = check.stage_config(steps=steps, eval_every=0, checkpoint_every=1)
    check.run(run_dir, config=config, mesh=mesh)
