"""HSA-RL (paper §3.3) as one library call: `run_rl`.

Starting from HSA-SFT (+ General OPD), the policy rolls out complete agent episodes in the
live room with its current weights (`rl._rl_source.RLSource`: lockstep-batched group
rollouts, HAT advantages, one row per model call) and is updated with GSPO's
sequence-level importance ratios (`rl._rl_loss.rl_loss`), several minibatch updates per
rollout, optionally with a k3 KL to a frozen reference. HSA-RL and the Agentic-RL ablation
differ only in the room's Harness augmentation (`SimConfig.hsa`: `original_fraction` 1
for Agentic RL).

It runs on `hat_jax.train`'s stage driver: the policy trained (and, with `kl_coef` > 0, the
reference frozen beside it; checkpoints hold the policy at their root). Evaluations (step 0,
every `eval_every`, the last step) roll out held-out scenarios of the dev split greedily and
report the mean rewards, rounds and fallbacks; a few whole trajectories are written readably
to `<run>/trajectories/step_<n>.md` (and in full to `.jsonl`). The loop's wall-clock limits
come from the config (a CPU rollout of a tiny model has no business with 10 s budgets) and
are recorded in `<run>/rl_run.json` with the rest of the run's metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import models
from hat_jax import files
from hat_jax.metrics import read_metrics
from hat_jax.sharding import MeshConfig, to_host
from hat_jax.train import (
    RANDOM,
    Init,
    ModelSpec,
    OptimizerConfig,
    StageConfig,
    StageDriver,
    TrainerConfig,
    TrainState,
    model_token_logprobs,
    next_token_targets,
)
from rl import _rollout
from rl._rl_loss import RL_KEYS, derived, rl_loss
from rl._rl_source import RLRolloutConfig, RLSource
from rl._summary import jsonable, write_summary
from rl.advantages import REWARD_DIMS, HatAdvantageConfig
from rl.sim import LiveRoom, SimConfig

SUMMARY_FILE = "rl_summary"
HELDOUT_DIR = "heldout"  # per-episode held-out rewards of each evaluation
OLD_LOGPROBS = ("sampler", "recompute")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLConfig:
    """Everything `run_rl` needs besides the model, the room and the tokenizer.

    Attributes:
      trainer: loop schedule; a step is one minibatch update (`batch_size` segments of
        `seq_len` tokens: context + sampled tokens; longer segments are left out, counted).
      optimizer: AdamW and its schedule; mesh: device mesh axis sizes.
      rollout: scenarios x group size per rollout, epochs over it, sampling.
      sim: the room: scenario split, HSA (`original_fraction=1.0`: Agentic RL), faults and
        the loop's limits (rounds; wall-clock budgets from config, see the module docstring).
      advantages: HAT's pools, GDPO weights, CoT-length term, filtering.
      eps_low, eps_high: GSPO's clip range; token_level: GSPO-token instead.
      kl_coef, kl_estimator: the KL to the frozen reference (0: no reference model).
      old_logprobs: "sampler" (the sampler's own) or "recompute" (a forward pass first).
      aux_loss_coef: weight of the MoE load-balancing loss.
      logits_chunk: > 0 computes log-probs this many positions at a time from the final
        hidden states (the loss, the reference and `old_logprobs="recompute"`): no
        `[rows, T, V]` logits, which at Qwen's 248K vocabulary are 11 GiB per 12K-token row.
      eval_scenarios: held-out (dev) scenarios per evaluation, rolled out greedily.
      eval_trajectories: whole trajectories written per evaluation.
      keep_rollouts: newest rollout files kept (resume needs the one in progress).
    """

    trainer: TrainerConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()
    rollout: RLRolloutConfig = RLRolloutConfig()
    sim: SimConfig = SimConfig()
    advantages: HatAdvantageConfig = HatAdvantageConfig()
    eps_low: float = 3e-4
    eps_high: float = 4e-4
    token_level: bool = False
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    old_logprobs: str = "sampler"
    aux_loss_coef: float = 0.0
    logits_chunk: int = 0
    eval_scenarios: int = 8
    eval_trajectories: int = 3
    keep_rollouts: int = 4

    def __post_init__(self):
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"RLConfig: old_logprobs={self.old_logprobs!r}, one of {OLD_LOGPROBS}")
        if not (self.eps_low >= 0 and self.eps_high >= 0 and self.kl_coef >= 0):
            raise ValueError(
                f"RLConfig: eps_low={self.eps_low}, eps_high={self.eps_high}, "
                f"kl_coef={self.kl_coef} must be >= 0"
            )
        if self.logits_chunk < 0:
            raise ValueError(f"RLConfig: logits_chunk={self.logits_chunk} must be >= 0")
        if self.eval_scenarios < 1 or self.keep_rollouts < 1:
            raise ValueError(
                f"RLConfig: eval_scenarios={self.eval_scenarios} and "
                f"keep_rollouts={self.keep_rollouts} must be >= 1"
            )


@dataclasses.dataclass(frozen=True)
class RLResult:
    """Where a finished RL stage left things, and its before/after figures."""

    run_dir: pathlib.Path
    step: int
    checkpoint_dir: pathlib.Path | None
    before: dict[str, float]
    after: dict[str, float]
    train: dict[str, float]
    seconds: float
    summary_path: pathlib.Path
    resumed_from: int | None
    change: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def rl_driver(
    config: RLConfig,
    *,
    model_config: models.QwenConfig,
    run_dir: os.PathLike | str,
    init_policy: Init = RANDOM,
    run_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> StageDriver:
    """The RL stage on the stage driver: the policy trained (and a frozen reference read from
    the policy's own source when `kl_coef` > 0), GSPO on one row per segment."""
    seed = config.trainer.seed
    build = lambda: models.Qwen(model_config, rngs=nnx.Rngs(seed))  # noqa: E731
    policy = ModelSpec(build=build, init=init_policy)
    specs: Mapping[str, ModelSpec] | ModelSpec = policy
    if config.kl_coef:
        specs = {"policy": policy, "reference": ModelSpec(build=build, init=init_policy,
                                                          frozen=True)}  # fmt: skip
    loss = functools.partial(
        rl_loss, eps_low=config.eps_low, eps_high=config.eps_high,
        token_level=config.token_level, kl_coef=config.kl_coef,
        kl_estimator=config.kl_estimator, aux_loss_coef=config.aux_loss_coef,
        logits_chunk=config.logits_chunk,
    )  # fmt: skip
    return StageDriver(
        StageConfig(trainer=config.trainer, optimizer=config.optimizer, mesh=config.mesh),
        models=specs,
        loss_fn=loss,
        run_dir=run_dir,
        batch_keys=RL_KEYS,
        checkpoint_root="policy" if config.kl_coef else None,
        run_config=run_config,
        model_config=model_config.to_dict(),
        derive_metrics=derived,
        mesh=mesh,
    )


@functools.partial(jax.jit, static_argnums=(0, 4))
def _forward_logprobs(graphdef, params, rest, batch, logits_chunk):
    model = nnx.merge(graphdef, params, rest)
    out = model(batch["input_ids"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    targets, _ = next_token_targets(batch)
    logp = model_token_logprobs(model, out, targets, logits_chunk=logits_chunk)
    return jnp.pad(logp, ((0, 0), (1, 0))) * batch["loss_mask"]


def recompute_logprobs(
    policy: models.Qwen, rows: Mapping[str, np.ndarray], *, logits_chunk: int = 0
) -> np.ndarray:
    """f32[rows, T] the log-probs of each row's tokens under `policy` (a forward pass; aligned
    with the tokens, 0 off the loss mask): old log-probs when not taking the sampler's."""
    graphdef, params, rest = nnx.split(policy, nnx.Param, ...)
    keys = ("input_ids", "positions", "segment_ids", "loss_mask")
    batch = {k: rows[k] for k in keys}
    return np.asarray(to_host(_forward_logprobs(graphdef, params, rest, batch, logits_chunk)))


class HeldOut:
    """Greedy rollouts of held-out (dev) scenarios: mean rewards, rounds, fallbacks; writes a
    few whole trajectories (an `hat_jax.train.Evaluation`)."""

    def __init__(self, driver: StageDriver, source: RLSource, room: LiveRoom,
                 config: RLConfig, run_dir: pathlib.Path):  # fmt: skip
        self.driver, self.source, self.room, self.config = driver, source, room, config
        self.run_dir = run_dir

    def __call__(self, state: TrainState) -> dict[str, float]:
        model = self.driver.model(state)
        policy_model = getattr(model, "policy", model)
        if self.source.policy is None:
            self.source.policy = self.source.policy_for(policy_model)
        else:
            self.source.policy.update(policy_model)
        r = _rollout.rollout(self.room, self.source.policy, scenarios=self.config.eval_scenarios,
                             group_size=1, seed=0,
                             sampling=self.config.rollout.sampling(greedy=True),
                             chunk=self.config.rollout.sample_chunk,
                             decoder=self.source.rollout_decoder(policy_model))  # fmt: skip
        rewards = np.stack([e.rewards.as_array() for e in r.episodes])
        out = {f"reward/{d}": float(rewards[:, i].mean()) for i, d in enumerate(REWARD_DIMS)}
        out["reward/mean"] = float(rewards.mean())
        trajectories = [e.trajectory for e in r.episodes]
        out["rounds"] = float(np.mean([t.rounds for t in trajectories]))
        out["fallback"] = float(np.mean([t.final.fallback for t in trajectories]))
        out["faults"] = float(np.mean([len(t.faults) for t in trajectories]))
        step = int(jax.device_get(state.step))
        if jax.process_index() == 0:  # per episode, for the paired before/after interval
            files.write_json(self.run_dir / HELDOUT_DIR / f"step_{step}.json", {
                "scenarios": [e.scenario.id for e in r.episodes],
                "rewards": {d: rewards[:, i].tolist() for i, d in enumerate(REWARD_DIMS)},
            })  # fmt: skip
        self._write(step, r.episodes[: self.config.eval_trajectories])
        return out

    def _write(self, step: int, episodes) -> None:
        if jax.process_index() != 0 or not episodes:
            return
        base = self.run_dir / "trajectories" / f"step_{step}"
        lines = [json.dumps({"scenario": e.scenario.id, "augmented": e.augmented,
                             "rewards": e.rewards.to_dict(),
                             "trajectory": e.trajectory.to_dict()}, ensure_ascii=False,
                            default=str) for e in episodes]  # fmt: skip
        files.write_jsonl(base.with_suffix(".jsonl"), lines)
        files.write_text(base.with_suffix(".md"), "\n".join(readable(e) for e in episodes))


def heldout_change(run_dir: pathlib.Path, first: int, last: int) -> dict[str, dict[str, float]]:
    """The held-out rewards' change from step `first` to `last`: per reward and for their
    mean, a paired bootstrap over the same greedy episodes (the 95% interval of the mean
    difference); {} when either step's per-episode file is missing or they differ."""
    from hat_jax.eval import paired_bootstrap

    paths = [run_dir / HELDOUT_DIR / f"step_{s}.json" for s in (first, last)]
    if first == last or not all(p.is_file() for p in paths):
        return {}
    before, after = (json.loads(p.read_text()) for p in paths)
    if before["scenarios"] != after["scenarios"]:
        return {}
    out = {}
    for name in (*REWARD_DIMS, "mean"):
        pick = (lambda r: np.mean([r[d] for d in REWARD_DIMS], axis=0)) if name == "mean" \
            else (lambda r, name=name: np.asarray(r[name]))  # fmt: skip
        b = paired_bootstrap(pick(before["rewards"]), pick(after["rewards"]))
        out[name] = {"before": b.mean_a, "after": b.mean_b, "delta": b.delta,
                     "low": b.low, "high": b.high, "n": b.n}  # fmt: skip
    return out


def readable(episode) -> str:
    """One episode as Markdown: the comment, each round (reasoning, reply, tool calls and
    their results), Hook events, faults, the final reply and the rewards."""
    t = episode.trajectory
    comments = " / ".join(c.get("text", "") for c in t.request.get("comments", []))
    lines = [f"## {episode.scenario.id} ({episode.scenario.family}; Harness "
             f"{'augmented' if episode.augmented else 'original'} {t.harness.get('version', '')})",
             "", f"**viewer:** {comments}", ""]  # fmt: skip
    for call in t.model_calls:
        out = call.output or {}
        lines.append(f"- round {call.round}" + (f" — error: {call.error}" if call.error else ""))
        if out.get("reasoning"):
            lines.append(f"  - reasoning: {out['reasoning'][:300]}")
        for c in out.get("tool_calls") or []:
            lines.append(f"  - tool call `{c['function']['name']}` {json.dumps(c['function']['arguments'], ensure_ascii=False)[:200]}")  # fmt: skip
        if out.get("content"):
            lines.append(f"  - text: {out['content'][:300]}")
        for rec in (r for r in t.tool_calls if r.round == call.round):
            shown = rec.error or json.dumps(rec.result, ensure_ascii=False, default=str)[:200]
            lines.append(f"  - result of `{rec.name}`: {shown}")
    for event in t.hook_events:
        lines.append(f"- hook `{event.hook}` ({event.point}, round {event.round}): "
                     f"{event.outcome} {event.detail[:160]}")  # fmt: skip
    for fault in t.faults:
        lines.append(f"- fault {fault.kind} (round {fault.round}): {fault.detail[:160]}")
    final = t.final
    spoken = final.public or final.private or final.no_reply_reason or "(nothing)"
    lines += ["", f"**reply** ({final.end}{', fallback' if final.fallback else ''}): {spoken}",
              "", "**rewards:** " + ", ".join(f"{d} {getattr(episode.rewards, d):.2f}"
                                              for d in REWARD_DIMS), ""]  # fmt: skip
    return "\n".join(lines)


def run_rl(
    config: RLConfig,
    *,
    model_config: models.QwenConfig,
    run_dir: os.PathLike | str,
    tokenizer,
    init_policy: Init,
    room: LiveRoom | None = None,
    eval_room: LiveRoom | None = None,
    run_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    draft_head: models.MTPHead | None = None,
) -> RLResult:
    """Runs (or resumes) HSA-RL and returns its before/after figures.

    Args:
      config: the stage config.
      model_config: the policy's config.
      run_dir: checkpoints, metrics, plots, rollouts, trajectories and the summary.
      tokenizer: the policy's tokenizer.
      init_policy: `abstract params -> params` of the starting policy (or `RANDOM`).
      room, eval_room: the live rooms of training and evaluation (default: built from
        `config.sim`, the evaluation on its dev split); a room's rewarder scores episodes.
      run_config: JSON-serialisable config saved with every checkpoint.
      mesh: overrides the mesh built from `config.mesh`.
      draft_head: the MTP draft head of speculative rollouts (`rollout.num_draft_tokens` >
        0), e.g. an MTP stage's `head`; it stays fixed while the policy trains, so its
        acceptance falls as the policy moves, but the samples keep the policy's distribution.
    """
    start = time.perf_counter()
    run_dir = pathlib.Path(run_dir)
    room = room or LiveRoom(config.sim)
    eval_room = eval_room or LiveRoom(dataclasses.replace(config.sim, split="dev"))
    driver = rl_driver(config, model_config=model_config, run_dir=run_dir,
                       init_policy=init_policy, run_config=run_config, mesh=mesh)  # fmt: skip
    source = RLSource(
        room, tokenizer, rollout=config.rollout, advantages=config.advantages,
        batch_size=config.trainer.batch_size, seq_len=config.trainer.seq_len, run_dir=run_dir,
        seed=config.trainer.seed, keep_rollouts=config.keep_rollouts, draft_head=draft_head,
        recompute=(functools.partial(recompute_logprobs, logits_chunk=config.logits_chunk)
                   if config.old_logprobs == "recompute" else None),
    )  # fmt: skip
    source.eval_episodes = config.eval_scenarios
    evaluation = HeldOut(driver, source, eval_room, config, run_dir)
    _write_metadata(run_dir, config, room)
    resumed = driver.start(source, [evaluation])
    if resumed is None:
        driver.log_evaluation()  # step 0: the policy as it came
    trained = driver.train()
    records = read_metrics(run_dir)
    evals = {r["step"]: {k[5:]: v for k, v in r.items() if k.startswith("eval/")}
             for r in records if "eval/reward/mean" in r}  # fmt: skip
    steps = [r for r in records if "reward/accuracy" in r]
    first, last = (steps[0], steps[-1]) if steps else ({}, {})
    mean = lambda r: float(np.mean([r.get(f"reward/{d}", np.nan) for d in REWARD_DIMS]))  # noqa: E731
    result = RLResult(
        run_dir=run_dir, step=trained.step, checkpoint_dir=trained.checkpoint_dir,
        before=evals.get(0, {}), after=evals.get(trained.step, {}),
        train={"reward_first": mean(first), "reward_last": mean(last), "rollouts": len(steps)},
        seconds=time.perf_counter() - start, summary_path=run_dir / f"{SUMMARY_FILE}.json",
        resumed_from=resumed, change=heldout_change(run_dir, 0, trained.step),
    )  # fmt: skip
    write_summary(run_dir, SUMMARY_FILE, result, config, summary_lines(result, config))
    return result


def _write_metadata(run_dir: pathlib.Path, config: RLConfig, room: LiveRoom) -> None:
    """What the run's rollouts mean: the loop limits (wall-clock budgets as configured),
    the Harness, the room."""
    if jax.process_index() != 0:
        return
    files.write_json(run_dir / "rl_run.json", json.loads(json.dumps({
        "limits": dataclasses.asdict(room.config.limits),
        "budgets": "wall-clock budgets from config (sim.limits); per call a token budget of "
                   f"{config.rollout.max_tokens} (rollout.max_tokens)",
        "harness": {"name": room.harness.name, "version": room.harness.version},
        "sim": dataclasses.asdict(room.config),
        "scenarios": len(room.scenarios),
        "rewarder": type(room.rewarder).__name__,
    }, default=str)))  # fmt: skip


_ROWS = [(f"reward/{d}", d.replace("_", " "), "{:.3f}") for d in REWARD_DIMS] + [
    ("reward/mean", "mean of the four rewards", "{:.3f}"),
    ("rounds", "model rounds per episode", "{:.2f}"),
    ("fallback", "episodes ended by a fallback", "{:.2f}"),
]


def summary_lines(result: RLResult, config: RLConfig) -> Sequence[str]:
    t, r = result.train, config.rollout
    lines = [
        f"HSA-RL in the {config.sim.room} live room: {result.step} updates on {t['rollouts']} "
        f"rollouts ({r.scenarios} scenarios x "
        f"{r.group_size} episodes, HSA original share {config.sim.hsa.original_fraction}) in "
        f"{result.seconds:.0f} s; training reward (mean of four) {t['reward_first']:.3f} "
        f"(first rollout) -> {t['reward_last']:.3f} (last).",
        "",
        f"| held-out ({config.eval_scenarios} dev scenarios, greedy) | before | after |",
        "|---|---|---|",
    ]
    for key, label, fmt in _ROWS:
        if key in result.after:
            before = result.before.get(key, float("nan"))
            lines.append(f"| {label} | {fmt.format(before)} | {fmt.format(result.after[key])} |")
    for key, c in result.change.items():
        label = "mean of the four rewards" if key == "mean" else key.replace("_", " ")
        lines.append(f"held-out {label}: {c['before']:.3f} -> {c['after']:.3f}, change "
                     f"{c['delta']:+.3f} (95% interval {c['low']:+.3f} to {c['high']:+.3f}, "
                     f"paired over {c['n']} episodes)")  # fmt: skip
    lines += ["", f"checkpoint: {result.checkpoint_dir}",
              f"metrics: {result.run_dir / 'metrics.jsonl'}; trajectories: "
              f"{result.run_dir / 'trajectories'}"]  # fmt: skip
    return lines
