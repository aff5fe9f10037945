"""A small HSA-RL setup shared by the RL tests, and the 1-vs-8-device check.

The bundled Harness renders ~3.7K prompt tokens, too many for a test of dozens of RL steps
on a CPU; `compact_room` keeps its runtime (loop, Hooks, tools, faults) but trims the
Harness to one short prompt block, two tools and one Skill (a few hundred tokens). The
synthetic reward (`FirstTokenReward`) has a known optimum a one-layer model can reach: 1
when the first token the policy samples in an episode falls in a fixed fifth of the
vocabulary, else 0 (on all four dimensions, so the segment's pool does not matter).

Run as a program (`python -m tests.rl.rl_check OUT_DIR`) by `test_rl_stage.py`: the same run
on one device and on 8 (data 2 x FSDP 4), in its own process with XLA's classic CPU runtime
(see `tests/train/qwen_mesh_check.py`), writing each run's per-step losses.
"""

import dataclasses
import json
import pathlib
import sys

import jax
import numpy as np

import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import harness as hx
from hat_jax import sharding, train
from rl.rewards import RewardVector
from rl.sim import HsaConfig, LiveRoom, SimConfig


def model_config() -> models.QwenConfig:
    vocab = -(-len(load_tokenizer()) // 128) * 128
    return models.QwenConfig.preset(
        "tiny", vocab_size=vocab, num_layers=1, layer_types=("full_attention",),
        moe_dispatch="dense", dtype="float32", param_dtype="float32",
    )  # fmt: skip


def compact_harness(harness: hx.Harness) -> hx.Harness:
    """The Harness with one short prompt block, `load_skill` and `reply_public`, one Skill."""
    keep_tools = ("load_skill", "reply_public")
    skill = harness.skill("general-reply")
    prompt = harness.prompt
    block = dataclasses.replace(prompt.blocks[0], items=prompt.blocks[0].items[:1])
    return dataclasses.replace(
        harness,
        tools=tuple(t for t in harness.tools if t.name in keep_tools),
        skills=(dataclasses.replace(skill, rules=skill.rules[:1], allowed_tools=()),),
        prompt=dataclasses.replace(prompt, blocks=(block,)),
    )


class FirstTokenReward:
    """1 on every dimension when the episode's first sampled token is in `target`."""

    def __init__(self, vocab: int, modulus: int = 6):
        self.modulus = modulus

    def hit(self, trajectory: hx.Trajectory) -> bool:
        for call in trajectory.model_calls:
            ids = (call.output or {}).get("token_ids")
            if ids:
                return ids[0] % self.modulus == 0
        return False

    def score(self, scenario, trajectory, state) -> RewardVector:
        r = float(self.hit(trajectory))
        return RewardVector(accuracy=r, effectiveness=r, tool_rationality=r, skill_selection=r)


def rooms(hsa: bool = False) -> tuple[LiveRoom, LiveRoom]:
    """Training and held-out rooms on the compact Harness, one model round per episode."""
    base = LiveRoom()
    harness = compact_harness(base.harness)
    reward = FirstTokenReward(model_config().vocab_size)
    sim = SimConfig(
        hsa=HsaConfig(dims=frozenset(), original_fraction=1.0) if not hsa else HsaConfig(),
        limits=hx.Limits(max_rounds=1, budget_s=1e6, tool_timeout_s=60),
    )
    make = lambda split: LiveRoom(dataclasses.replace(sim, split=split), world=base.world,  # noqa: E731
                                  harness=harness, rewarder=reward)  # fmt: skip
    return make("train"), make("dev")


def stage_config(steps: int = 30, learning_rate: float = 1e-2, **trainer) -> rl.RLConfig:
    base = dict(total_steps=steps, batch_size=32, seq_len=768, log_every=1,
                eval_every=max(steps // 2, 1), checkpoint_every=max(steps // 3, 1),
                keep_checkpoints=4, progress=False, plots=False, async_checkpoints=False)  # fmt: skip
    return rl.RLConfig(
        trainer=train.TrainerConfig(**(base | trainer)),
        optimizer=train.OptimizerConfig(
            learning_rate=learning_rate,
            warmup_steps=0,
            decay_steps=steps,
            min_learning_rate_ratio=1.0,
            weight_decay=0.0,
        ),  # fmt: skip
        rollout=rl.RLRolloutConfig(
            scenarios=8,
            group_size=4,
            max_tokens=2,
            enable_thinking=False,
            decode_moe_dispatch="dense",
        ),  # fmt: skip
        advantages=rl.HatAdvantageConfig(length_weight=0.0),
        eval_scenarios=16,
        eval_trajectories=2,
    )


def run(run_dir, *, config=None, mesh=None, fail_at: int | None = None):
    """One RL run (or resume) of the shared setup; returns the `RLResult`."""
    tokenizer = load_tokenizer()
    train_room, dev_room = rooms()
    if fail_at is not None:
        train_room = _Dying(train_room, fail_at)
    return rl.run_rl(
        config or stage_config(), model_config=model_config(), run_dir=run_dir,
        tokenizer=tokenizer, init_policy=train.RANDOM, room=train_room, eval_room=dev_room,
        mesh=mesh or sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1]),
    )  # fmt: skip


class _Dying:
    """A room whose `fail_at`-th rollout dies (its episodes' calls raise), like a killed job."""

    def __init__(self, room: LiveRoom, fail_at: int):
        self.room, self.fail_at, self.started = room, fail_at, 0

    def __getattr__(self, name):
        return getattr(self.room, name)

    def sample(self, seed):
        if self.started == self.fail_at * 8:  # 8 scenarios per rollout
            raise KeyboardInterrupt(f"killed in rollout {self.fail_at}")
        self.started += 1
        return self.room.sample(seed)


def step_losses(run_dir, key: str = "loss") -> dict[int, float]:
    from hat_jax.metrics import read_metrics

    return {r["step"]: r[key] for r in read_metrics(run_dir) if key in r}


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    config = stage_config(steps=3, eval_every=0, checkpoint_every=3)
    layouts = {"one": (sharding.MeshConfig(), 1), "eight": (sharding.MeshConfig(data=2, fsdp=4), 8)}
    losses = {}
    for name, (mesh_config, devices) in layouts.items():
        mesh = sharding.make_mesh(mesh_config, devices=jax.devices()[:devices])
        run(out / name, config=config, mesh=mesh)
        # A fresh minibatch's GSPO loss is −mean(A) ≈ 0 (normalised advantages, ratio 1): the
        # gradient norm and the rewards say whether the runs agree.
        losses[name] = {k: step_losses(out / name, k)
                        for k in ("loss", "grad_norm", "reward/accuracy")}  # fmt: skip
    (out / "losses.json").write_text(json.dumps(losses))
    np.save(out / "done.npy", np.ones(1))
