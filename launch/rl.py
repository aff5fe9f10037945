"""HSA-RL (or the Agentic-RL ablation) of a policy in the simulated live room.

  python -m launch.rl --config=configs/rl_demo.py             # the demo's SFT policy, HSA-RL
  python -m launch.rl --config=configs/rl_demo.py:agentic     # the original Harness only
  python -m launch.rl --config=configs/rl_qwen3_6_35b_a3b.py \
      --config.policy.path=/runs/opd_qwen3_6_35b_a3b/checkpoints

The policy (`config.policy`: "orbax", "hf" or "random") rolls out whole episodes with its
current weights (lockstep-batched groups, the real agent loop with Skills, tools, Hooks and
injected faults), HAT's advantages weigh each model call, and GSPO updates it (`rl.run_rl`).
Rewards are the rule rewards, or a judge panel's for Accuracy and Effectiveness
(`config.judge`). Writes checkpoints, metrics, plots, `rollouts/`, `trajectories/`,
`rl_run.json` and `rl_summary.{json,md}`.
"""

import dataclasses
import pathlib

from absl import app

import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import harness as hx
from hat_jax import hsa, livestream, sharding, train
from launch import _common
from rl import rewards, sim

_FLAGS: dict = {}


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's dataclasses."""

    rl: rl.RLConfig
    model: models.QwenConfig
    policy: tuple[str, str]
    tokenizer_dir: str | None
    run_dir: pathlib.Path


def _sim(c) -> sim.SimConfig:
    s = c.sim
    return sim.SimConfig(
        room=s.room,
        split=s.split,
        hsa=sim.HsaConfig(
            dims=hsa.parse_dims(s.hsa_dims),
            strength=s.hsa_strength,
            original_fraction=s.original_fraction,
        ),  # fmt: skip
        faults=sim.FaultConfig(
            timeout=s.fault_timeout, malformed=s.fault_malformed, denied=s.fault_denied
        ),  # fmt: skip
        limits=hx.Limits(
            max_rounds=s.max_rounds, budget_s=s.budget_s, tool_timeout_s=s.tool_timeout_s
        ),  # fmt: skip
    )


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` and converts it into dataclasses (reads the tokenizer and model config)."""
    policy = (c.policy.kind, c.policy.path)
    tokenizer_dir = _common.tokenizer_dir(c, "policy")
    model = _common.model_config(c.model, policy, load_tokenizer(tokenizer_dir), name="policy")
    a = c.advantages
    config = rl.RLConfig(
        trainer=train.TrainerConfig.from_dict(c.trainer.to_dict()),
        optimizer=train.OptimizerConfig.from_dict(c.optimizer.to_dict()),
        mesh=sharding.MeshConfig.from_dict(c.mesh.to_dict()),
        rollout=rl.RLRolloutConfig(
            **{k: v for k, v in c.rollout.to_dict().items() if k != "draft_head"}
        ),
        sim=_sim(c),
        advantages=rl.HatAdvantageConfig(length_weight=a.length_weight, length_low=a.length_low,
                                         length_high=a.length_high, filter_atol=a.filter_atol),
        **c.gspo.to_dict(),
        kl_coef=c.kl_coef,
        kl_estimator=c.kl_estimator,
        old_logprobs=c.old_logprobs,
        aux_loss_coef=c.aux_loss_coef if c.aux_loss_coef >= 0 else model.router_aux_loss_coef,
        logits_chunk=c.logits_chunk,
        eval_scenarios=c.eval.scenarios,
        eval_trajectories=c.eval.trajectories,
        keep_rollouts=c.keep_rollouts,
    )  # fmt: skip
    return Built(rl=config, model=model, policy=policy, tokenizer_dir=tokenizer_dir,
                 run_dir=pathlib.Path(run_dir or c.run_dir))  # fmt: skip


def rooms(c, config: rl.RLConfig) -> tuple[sim.LiveRoom, sim.LiveRoom]:
    """The training and held-out rooms: the world and Harness (validated on load: a world
    folder's own, else the bundled room's), the scenarios (a JSONL file, or the room's), the
    rewarder (rules, or the judge panel's)."""
    room = livestream.room(config.sim.room)
    world = livestream.load_world(c.sim.world or room.world_dir)
    harness = hx.load(world.root if c.sim.world else room.harness_dir)
    scenarios = sim.read_scenarios(c.sim.scenarios) if c.sim.scenarios else None
    rewarder = rewards.Rewarder(harness)
    if c.judge.endpoints:
        judges = []
        for entry in c.judge.endpoints.split(","):
            base_url, _, model = entry.strip().partition("|")
            if not base_url or not model:
                raise ValueError(f"config.judge.endpoints: {entry!r} is not 'base_url|model'")
            judges.append(rewards.JudgeEndpoint(base_url=base_url, model=model))
        panel = rewards.JudgePanel(judges, cache_dir=c.judge.cache_dir or None)
        rewarder = rewards.JudgedRewarder(rewarder, panel, on_failure=c.judge.on_failure)
    make = lambda split: sim.LiveRoom(dataclasses.replace(config.sim, split=split),  # noqa: E731
                                      world=world, harness=harness, scenarios=scenarios,
                                      rewarder=rewarder)  # fmt: skip
    return make(c.sim.split), make(c.sim.eval_split)


def run(c, *, run_dir: str | None = None, mesh=None) -> rl.RLResult:
    """Runs (or resumes) the RL stage of config `c` (`mesh` overrides its mesh)."""
    built = build(c, run_dir=run_dir)
    head = _common.draft_head(c.rollout, built.rl.rollout.num_draft_tokens, built.policy,
                              built.model, block_name="rollout")  # fmt: skip
    room, eval_room = rooms(c, built.rl)
    return rl.run_rl(
        built.rl,
        model_config=built.model,
        run_dir=built.run_dir,
        tokenizer=load_tokenizer(built.tokenizer_dir),
        init_policy=_common.init_source(built.policy, built.model, name="policy"),
        room=room,
        eval_room=eval_room,
        run_config=c.to_dict(),
        mesh=mesh,
        draft_head=head,
    )


def summary(result: rl.RLResult) -> list[str]:
    """Report lines for a finished run (e.g. for the pipeline report)."""
    b, a, t = result.before, result.after, result.train
    nan = float("nan")
    return [
        f"{result.step} updates in {result.seconds:.0f} s: training reward {t['reward_first']:.3f}"
        f" -> {t['reward_last']:.3f}; held-out reward {b.get('reward/mean', nan):.3f} -> "
        f"{a.get('reward/mean', nan):.3f}",
        f"checkpoint: {result.checkpoint_dir}; summary: {result.summary_path}",
    ]


def main(argv):
    del argv
    _common.run_main("rl", run, summary, _FLAGS)


if __name__ == "__main__":
    _FLAGS.update(_common.define_flags("configs/rl_demo.py"))
    app.run(main)
