"""A small General OPD run, shared by the OPD tests, and the 1-vs-8-device check.

The teacher is a fixed random one-layer Qwen with a sharpened LM head (low-entropy,
context-dependent outputs: a near-uniform random teacher would leave little to distil); the
student is the teacher with every parameter perturbed by noise. Prompts are the bundled
demo instructions (the last 8 held out), rendered with the demo tokenizer.

Run as a program (`python -m tests.rl.opd_check OUT_DIR`) by `test_opd_stage.py`: it runs the
same stage on one device and on 8 (FSDP 4 x data 2), in its own process with XLA's classic CPU
runtime (see `tests/train/qwen_mesh_check.py`), and writes each run's per-step losses.
"""

import json
import pathlib
import sys

import jax
import numpy as np
from flax import nnx

import data
import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import sharding, train

HELD_OUT = 8


def model_config() -> models.QwenConfig:
    vocab = -(-len(load_tokenizer()) // 128) * 128
    return models.QwenConfig.preset(
        "tiny", vocab_size=vocab, num_layers=1, layer_types=("full_attention",),
        moe_dispatch="dense", dtype="float32", param_dtype="float32",
    )  # fmt: skip


def teacher_params(config: models.QwenConfig, scale: float = 8.0):
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    model.lm_head.set_value(model.lm_head.get_value() * scale)
    return nnx.state(model, nnx.Param)


def perturbed(params, noise: float = 0.5, seed: int = 1):
    """Every parameter plus `noise` x its own RMS x standard normal noise."""
    rng = np.random.default_rng(seed)

    def one(x):
        x = np.asarray(x)
        rms = float(np.sqrt(np.mean(x * x))) or 1.0
        return x + noise * rms * rng.standard_normal(x.shape).astype(x.dtype)

    return jax.tree.map(one, params)


def stage_config(steps: int = 12, **trainer) -> rl.OPDConfig:
    base = dict(total_steps=steps, batch_size=8, seq_len=112, log_every=1,
                eval_every=steps // 2, checkpoint_every=steps // 3, keep_checkpoints=4,
                progress=False, plots=False, async_checkpoints=False)  # fmt: skip
    return rl.OPDConfig(
        trainer=train.TrainerConfig(**(base | trainer)),
        optimizer=train.OptimizerConfig(learning_rate=3e-3, warmup_steps=1, decay_steps=steps,
                                        weight_decay=0.0),  # fmt: skip
        max_prompt_len=96, max_new_tokens=16, eval_max_prompts=HELD_OUT, eval_samples=2,
    )  # fmt: skip


class CrashingPrompts:
    """Prompt batches that die when asked for batch `at` (0-based), like a killed process."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.served = inner, at, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.served == self.at:
            raise KeyboardInterrupt(f"killed before batch {self.at}")
        self.served += 1
        return next(self.inner)

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)

    def stats(self):
        return self.inner.stats()


def run(run_dir, *, mesh=None, crash_at: int | None = None, config=None, estimator="exact"):
    """One OPD run (or resume) of the shared setup; returns the `OPDResult`."""
    tokenizer = load_tokenizer()
    qwen = model_config()
    teacher = teacher_params(qwen)
    student = perturbed(teacher)
    config = config or stage_config()
    if estimator != "exact":
        import dataclasses

        config = dataclasses.replace(config, estimator=estimator)
    instructions = data.load_instructions()
    prompts = data.opd_prompt_data(
        instructions[:-HELD_OUT], global_batch_size=config.trainer.batch_size,
        max_prompt_len=config.max_prompt_len, enable_thinking=False, tokenizer=tokenizer,
    )  # fmt: skip
    if crash_at is not None:
        prompts = CrashingPrompts(prompts, crash_at)
    return rl.run_opd(
        config, student_config=qwen, teacher_config=qwen, run_dir=run_dir, prompts=prompts,
        heldout=instructions[-HELD_OUT:], tokenizer=tokenizer,
        init_student=lambda abstract: student, init_teacher=lambda abstract: teacher,
        mesh=mesh or sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1]),
    )  # fmt: skip


def step_losses(run_dir) -> dict[int, float]:
    from hat_jax.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    config = stage_config(steps=4, eval_every=0, checkpoint_every=4)
    layouts = {"one": (sharding.MeshConfig(), 1), "eight": (sharding.MeshConfig(data=2, fsdp=4), 8)}
    losses = {}
    for name, (mesh_config, devices) in layouts.items():
        mesh = sharding.make_mesh(mesh_config, devices=jax.devices()[:devices])
        run(out / name, mesh=mesh, config=config)
        losses[name] = step_losses(out / name)
    (out / "losses.json").write_text(json.dumps(losses))
