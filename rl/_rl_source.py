"""The on-policy batch source of HSA-RL: rollouts with the current weights, HAT advantages,
one training row per segment, and several minibatch updates per rollout.

When its minibatches run out, `RLSource` rolls out a step's episodes with the policy's
current weights (`rl._rollout.rollout`), scores them (the room's rewarder), computes HAT's
advantages over the segments (`rl.hat_advantages`: tool and reply pools, GDPO per dimension
within the group, the CoT-length term, batch normalisation, zero-advantage filtering), lays
the kept segments out as rows (`rl._rollout.rows`) and splits them into minibatches of
`batch_size` rows, `epochs` passes over them. Each rollout's rows are written to
`<run>/rollouts/<n>.npz` (atomically, compressed; the newest `keep_rollouts` kept) before
training on them, so a run resumed in the middle of a rollout trains on the very same rows;
the source's state is the rollout count and the minibatch reached.

In a job of several processes every process runs the whole rollout: the episodes' host
logic is replicated (a rollout is a function of the weights and the seed alone), each
barrier's batch is sampled as one program over the job's devices, and each process trains on
its share of every minibatch (`hat_jax.sharding.process_rows`): the global batches of a
single process. The position is the same on every process, so a checkpoint resumes under
another process count; the rows file is written once, by process 0, into the run directory
the processes share. Wall-clock limits that bind (`sim.budget_s`, tool timeouts) can make
hosts' rollouts diverge: a sampler call with different inputs stops the run naming the
processes, a different number of calls fails (or waits) in the next collective.

The first minibatch of a rollout carries the rollout's figures (rewards per dimension and
pool, q(L), CoT lengths, filtered share, faults, episode lengths, trajectories per second,
sampling time) and is marked `fresh` (trained with the weights that sampled it).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

import models
from hat_jax import files
from hat_jax.sharding import process_rows
from hat_jax.train import shared_state
from rl import _rollout
from rl._jax_policy import JaxPolicy
from rl.advantages import REPLY, REWARD_DIMS, TOOL, HatAdvantageConfig, hat_advantages
from rl.sim import LiveRoom
from rl.sim._room import _seed

ENGINES = ("lockstep", "slots")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLRolloutConfig:
    """What one rollout samples.

    Attributes:
      scenarios: rollout groups (scenarios) per rollout.
      group_size: episodes per group (G).
      epochs: passes over a rollout's rows (each pass is ceil(rows / batch_size) updates).
      temperature, top_p: the policy's sampling settings.
      max_tokens: token budget of one model call.
      enable_thinking: render prompts with the thinking header open.
      decode_moe_dispatch: MoE dispatch of the decode steps ("" keeps the model's).
      sample_chunk: conversations per sampler call (0: every episode's at once); smaller
        chunks hold smaller caches beside the train state.
      num_draft_tokens: > 0 samples self-speculatively with an MTP draft head (`run_rl`'s
        `draft_head`), verifying this many drafts per step: the same distribution as plain
        sampling (rejection sampling), log-probs from the verifier, fewer decode steps when
        the head predicts the policy well. 0 (default): plain sampling.
      engine: how the episodes' model calls are decoded: "lockstep" (default: a barrier
        gathers every live episode's call and samples them in one `models.Sampler` call,
        the shared prefix prefilled once) or "slots" (continuous batching on a
        `models.SlotDecoder`: a call joins between decode steps and leaves when its row
        ends, so no episode waits for the slowest row of a round; plain sampling, one
        prefill per call, `sample_chunk` does not apply).
    """

    scenarios: int = 4
    group_size: int = 4
    epochs: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    enable_thinking: bool = True
    decode_moe_dispatch: str = ""
    sample_chunk: int = 0
    num_draft_tokens: int = 0
    engine: str = "lockstep"

    def __post_init__(self):
        bad = {k: getattr(self, k) for k in ("scenarios", "group_size", "epochs", "max_tokens")
               if getattr(self, k) < 1}  # fmt: skip
        if bad:
            raise ValueError(f"RLRolloutConfig: values must be >= 1: {bad}")
        bad = {k: getattr(self, k) for k in ("sample_chunk", "num_draft_tokens")
               if getattr(self, k) < 0}  # fmt: skip
        if bad:
            raise ValueError(f"RLRolloutConfig: values must be >= 0: {bad}")
        if self.group_size < 2:
            raise ValueError(f"RLRolloutConfig: group_size={self.group_size}: GRPO needs >= 2")
        if self.engine not in ENGINES:
            raise ValueError(f"RLRolloutConfig: engine={self.engine!r}, choose one of {ENGINES}")
        if self.engine == "slots" and (self.num_draft_tokens or self.sample_chunk):
            raise ValueError(
                "RLRolloutConfig: engine='slots' decodes plainly with one slot per episode: "
                f"num_draft_tokens={self.num_draft_tokens} and sample_chunk={self.sample_chunk} "
                "apply to the lockstep engine (set them to 0)"
            )

    def sampling(self, *, greedy: bool = False):
        from hat_jax import harness as hx

        return hx.SamplingParams(
            temperature=0.0 if greedy else self.temperature, top_p=self.top_p,
            max_tokens=self.max_tokens, enable_thinking=self.enable_thinking,
        )  # fmt: skip


def policy_for(
    model: models.Qwen,
    tokenizer,
    *,
    seq_len: int,
    decode_moe_dispatch: str = "",
    draft_head: models.MTPHead | None = None,
    num_draft_tokens: int = 0,
):
    """A `JaxPolicy` whose sampler fits rows of `seq_len` tokens (prompt + sampled), sampling
    self-speculatively with `draft_head` when `num_draft_tokens` > 0."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    overrides = {"moe_dispatch": decode_moe_dispatch} if decode_moe_dispatch else None
    sampler = models.Sampler(
        model, pad_id=pad, max_length=seq_len, decode_overrides=overrides,
        mtp=draft_head if num_draft_tokens else None, num_draft_tokens=num_draft_tokens,
    )  # fmt: skip
    return JaxPolicy(model, tokenizer, sampler=sampler)


def slot_decoder_for(policy: JaxPolicy, *, slots: int, decode_moe_dispatch: str = ""):
    """A `models.SlotDecoder` over `policy`'s weights for continuous-batching rollouts
    (`RLRolloutConfig.engine="slots"`): its rows fit the policy's sampler (prompt + sampled),
    stop where the policy stops, with the same decode-step MoE dispatch."""
    overrides = {"moe_dispatch": decode_moe_dispatch} if decode_moe_dispatch else None
    return models.SlotDecoder(
        policy.model, slots=slots, max_length=policy.sampler.max_length,
        stop_tokens=policy.stop_tokens, pad_id=policy.sampler.pad_id,
        decode_overrides=overrides,
    )  # fmt: skip


def rollout_figures(r: _rollout.Rollouts, advantages, keep, penalty) -> dict[str, float]:
    """The host figures of one rollout (see the module docstring)."""
    kinds = np.asarray([s.kind for s in r.segments])
    cot = np.asarray([s.cot_length for s in r.segments], np.float64)
    rewards = np.stack([e.rewards.as_array() for e in r.episodes])
    out: dict[str, float] = {f"reward/{d}": float(rewards[:, i].mean())
                             for i, d in enumerate(REWARD_DIMS)}  # fmt: skip
    seg_rewards = _rollout.segment_rewards(r) if r.segments else np.zeros((0, 4))
    pools = {TOOL: ("tool", REWARD_DIMS[:2]), REPLY: ("reply", REWARD_DIMS[2:])}
    for kind, (name, dims) in pools.items():
        on = kinds == kind
        out[f"segments/{name}"] = float(on.sum())
        out[f"cot_length/{name}"] = float(cot[on].mean()) if on.any() else 0.0
        for d in dims:  # the pool's own dimensions, over its segments
            column = seg_rewards[on, REWARD_DIMS.index(d)] if on.any() else np.zeros(1)
            out[f"pool/{name}/{d}"] = float(column.mean())
    trajectories = [e.trajectory for e in r.episodes]
    out |= {
        "q_length": float(np.mean(penalty)) if len(penalty) else 0.0,
        "filtered": float(1.0 - np.mean(keep)) if len(keep) else 0.0,
        "advantage_abs": float(np.mean(np.abs(advantages))) if len(advantages) else 0.0,
        "episodes": float(len(r.episodes)),
        "rounds": float(np.mean([t.rounds for t in trajectories])),
        "fallback": float(np.mean([t.final.fallback for t in trajectories])),
        "faults_injected": float(np.mean([len(e.faults) for e in r.episodes])),
        "faults": float(np.mean([len(t.faults) for t in trajectories])),
        "hook_events": float(np.mean([len(t.hook_events) for t in trajectories])),
        "episode_tokens": float(
            np.mean(
                [
                    sum(len(s.completion) for s in r.segments if s.episode == i)
                    for i in range(len(r.episodes))
                ]
            )
        ),  # fmt: skip
        "trajectories_per_second": len(r.episodes) / max(r.seconds, 1e-9),
        "sampling_seconds": r.sampling_seconds,
        "rollout_seconds": r.seconds,
        "sampler_batches": float(r.batches),
    }
    if r.acceptance_length is not None:  # speculative rollouts: tokens per verification
        out["acceptance_length"] = r.acceptance_length
    return out


def segment_advantages(r: _rollout.Rollouts, config: HatAdvantageConfig):
    """`rl.hat_advantages` over a rollout's segments: each segment carries its episode's
    rewards, its kind (tool or reply pool), its group and its reasoning length."""
    segs = r.segments
    return hat_advantages(
        _rollout.segment_rewards(r) if segs else np.zeros((0, 4), np.float32),
        np.asarray([s.kind for s in segs], np.int32),
        np.asarray([s.group for s in segs], np.int32),
        np.asarray([s.cot_length for s in segs], np.float32),
        config,
    )


class RLSource:
    """An `hat_jax.train.OnPolicySource` of HSA-RL (see the module docstring).

    Args:
      room: the live room episodes run in.
      tokenizer: the policy's tokenizer.
      rollout: scenarios, group size, epochs and sampling.
      advantages: HAT's advantage settings.
      batch_size, seq_len: the trainer's rows per update and row length.
      run_dir: where rollouts are written.
      seed: the run's seed (each rollout's derives from it and the rollout count).
      recompute: recompute old log-probs with a forward pass of the current weights
        (`logprobs_fn(model, rows) -> f32[rows, T]`) instead of the sampler's.
      keep_rollouts: newest rollout files kept on disk (a resume inside a rollout needs its
        file).
    """

    resplits_states = True  # every process holds the same position

    def __init__(self, room: LiveRoom, tokenizer, *, rollout: RLRolloutConfig,
                 advantages: HatAdvantageConfig, batch_size: int, seq_len: int,
                 run_dir: pathlib.Path, seed: int, recompute=None,
                 keep_rollouts: int = 4, draft_head: models.MTPHead | None = None):  # fmt: skip
        if batch_size % jax.process_count():
            raise ValueError(
                f"RLSource: batch_size {batch_size} does not split over "
                f"{jax.process_count()} processes"
            )
        self.room, self.tokenizer, self.config = room, tokenizer, rollout
        self.advantage_config = advantages
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.dir, self.recompute = pathlib.Path(run_dir) / "rollouts", recompute
        self.policy: JaxPolicy | None = None
        self.keep = keep_rollouts
        if rollout.num_draft_tokens and draft_head is None:
            raise ValueError(
                f"RLSource: rollout.num_draft_tokens={rollout.num_draft_tokens} needs an MTP "
                "draft head (draft_head=...)"
            )
        self.draft_head = draft_head
        if rollout.engine == "slots" and jax.process_count() > 1:
            raise ValueError(
                "RLSource: rollout.engine='slots' runs in one process: every process samples "
                "the whole rollout, and which calls share a decode step follows each "
                "process's thread timing, so their rows are not guaranteed equal bit for bit; "
                f"use engine='lockstep' with {jax.process_count()} processes"
            )
        self.decoder = None  # engine="slots": the slot decoder, built with the policy
        self.eval_episodes = 0  # the held-out evaluation's episodes (slots it needs too)
        # rollouts started; the next minibatch of the newest and how many it has
        self.rollouts, self.minibatch, self.minibatches = 0, 0, 0
        self._rows: dict[str, np.ndarray] | None = None
        self._figures: dict[str, float] = {}
        self.last: _rollout.Rollouts | None = None

    # -- state -------------------------------------------------------------------------------

    def policy_for(self, policy_model) -> JaxPolicy:
        """The rollouts' policy for these weights (speculative when the config asks)."""
        return policy_for(
            policy_model, self.tokenizer, seq_len=self.seq_len,
            decode_moe_dispatch=self.config.decode_moe_dispatch, draft_head=self.draft_head,
            num_draft_tokens=self.config.num_draft_tokens,
        )  # fmt: skip

    def rollout_decoder(self, policy_model):
        """The slot decoder of `engine="slots"` holding `policy_model`'s weights (None for the
        lockstep engine): one slot per episode of a rollout or of the held-out evaluation."""
        if self.config.engine != "slots":
            return None
        if self.decoder is None:
            slots = max(self.config.scenarios * self.config.group_size, self.eval_episodes)
            self.decoder = slot_decoder_for(
                self.policy, slots=slots, decode_moe_dispatch=self.config.decode_moe_dispatch
            )
        self.decoder.update(policy_model)
        return self.decoder

    def _path(self, n: int) -> pathlib.Path:
        return self.dir / f"{n}.npz"

    def get_state(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "minibatch": self.minibatch,
                "minibatches": self.minibatches, "seed": self.seed}  # fmt: skip

    def set_state(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Restores a position: this source's own, or every process's of a run with another
        process count (all equal)."""
        state = shared_state(state, "RLSource")
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"RLSource: state for seed {state['seed']}, this source has {self.seed}"
            )
        self.rollouts, self.minibatch = int(state["rollouts"]), int(state["minibatch"])
        self.minibatches, self._rows = int(state["minibatches"]), None
        if self.minibatch < self.minibatches:  # stopped inside a rollout: train on its rows
            path = self._path(self.rollouts - 1)
            if not path.is_file():
                raise FileNotFoundError(
                    f"RLSource: resuming inside rollout {self.rollouts - 1} needs {path}, which "
                    f"is gone (only the newest {self.keep} rollouts are kept): resume from a "
                    "newer checkpoint, or raise keep_rollouts"
                )
            with np.load(path) as saved:
                self._rows = {k: saved[k] for k in saved.files}

    # -- batches -----------------------------------------------------------------------------

    def next_batch(self, model) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        figures: dict[str, float] = {}
        if self._rows is None or self.minibatch >= self.minibatches:
            figures = self._roll_out(getattr(model, "policy", model))
        k = self.minibatch
        self.minibatch += 1
        start = (k % (self.minibatches // self.config.epochs)) * self.batch_size
        batch = {key: v[start : start + self.batch_size] for key, v in self._rows.items()}
        short = self.batch_size - len(batch["input_ids"])
        if short:  # the last minibatch: empty rows weigh nothing
            batch = {key: np.concatenate([v, np.zeros((short, *v.shape[1:]), v.dtype)])
                     for key, v in batch.items()}  # fmt: skip
        batch["fresh"] = np.full_like(batch["loss_mask"], 1 if k == 0 else 0)
        return process_rows(batch, what="minibatch rows"), figures | {"minibatch": float(k)}

    def _roll_out(self, policy_model) -> dict[str, float]:
        if self.policy is None:
            self.policy = self.policy_for(policy_model)
        else:
            self.policy.update(policy_model)
        n = self.rollouts
        r = _rollout.rollout(self.room, self.policy, scenarios=self.config.scenarios,
                             group_size=self.config.group_size, seed=_seed("rl", self.seed, n),
                             sampling=self.config.sampling(),
                             chunk=self.config.sample_chunk,
                             decoder=self.rollout_decoder(policy_model))  # fmt: skip
        self.last = r
        segs = r.segments
        out = segment_advantages(r, self.advantage_config)
        advantages, keep = np.asarray(out.advantages), np.asarray(out.keep)
        kept = [s for s, k in zip(segs, keep, strict=True) if k > 0]
        rows, dropped = _rollout.rows(kept, advantages[keep > 0], seq_len=self.seq_len,
                                      pad_id=self.policy.sampler.pad_id)  # fmt: skip
        if self.recompute is not None and len(rows["input_ids"]):
            rows["old_logprobs"] = self.recompute(policy_model, rows)
        if not len(rows["input_ids"]):  # nothing to learn from: one empty minibatch
            rows = {k: np.zeros((1, self.seq_len), v.dtype) for k, v in rows.items()}
        self._write(n, rows)
        self._rows, self.rollouts, self.minibatch = rows, n + 1, 0
        self.minibatches = self.config.epochs * -(-len(rows["input_ids"]) // self.batch_size)
        figures = rollout_figures(r, advantages, keep, np.asarray(out.length_penalty))
        figures["rows_too_long"] = float(dropped)
        return figures

    def _write(self, n: int, rows: Mapping[str, np.ndarray]) -> None:
        if jax.process_index() != 0:  # every process holds the same rows
            return
        with files.atomic_open(self._path(n), "wb") as f:
            np.savez_compressed(f, **rows)
        stale = self._path(n - self.keep)
        if stale.exists():  # a resume inside a rollout needs that rollout's rows only
            stale.unlink()
