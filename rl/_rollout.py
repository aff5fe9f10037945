"""Group rollouts of whole agent episodes for HSA-RL, decoded in lockstep batches (or, with a
slot decoder, with continuous batching: `Continuous`, described there).

A rollout step draws `scenarios` scenarios from the live room; each gets one Harness state
(HSA-augmented, or the original for `SimConfig.hsa.original_fraction` of them, as
`LiveRoom.state_for` draws it) and `group_size` episodes: one GRPO group. Every episode runs
the real agent loop (`LiveRoom.run`: Skills, tools, Hooks with their retries, injected
faults, the round limit) on its own thread, and their model calls meet at a barrier
(`Lockstep`): once every live episode is waiting for the policy, the waiting conversations
are sampled in one `generate_batch` call, in episode order, with a seed derived from the
step's seed and the barrier's round. A step's rollouts are therefore a function of the
weights and the seed alone, whatever the threads' timing, and the sampler decodes a whole
step's calls of one round as one batch. With `rollout(..., decoder=)` the calls go to a
`models.SlotDecoder` instead, each seeded on its own, so no episode waits at a barrier.

Each model call that produced output is a segment (`rl.rewards.segments` decides tool-call or
reply): the exact token ids the sampler was given and sampled (the stop token included) and
the sampled tokens' log-probabilities under the unmodified policy (GSPO's old log-probs).
Nothing is decoded and re-tokenised: the training rows are these ids.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hat_jax import harness as hx
from models import combine_acceptance
from rl.rewards import segments as episode_segments
from rl.sim import LiveRoom
from rl.sim._room import Episode, _seed


@dataclasses.dataclass(frozen=True)
class Segment:
    """One model call of one episode, as the sampler saw and produced it.

    Attributes:
      episode, group: the episode's index in the step and its rollout group (scenario).
      round: the model round (1-based).
      kind: `rl.advantages.TOOL` or `REPLY`.
      cot_length: reasoning tokens of the call's output.
      prompt: int32[P] the ids the sampler continued.
      completion: int32[C] the ids it sampled.
      logprobs: f32[C] their log-probabilities under the policy (temperature 1, no filter).
    """

    episode: int
    group: int
    round: int
    kind: int
    cot_length: int
    prompt: np.ndarray
    completion: np.ndarray
    logprobs: np.ndarray


@dataclasses.dataclass
class Rollouts:
    """A step's episodes (in order; `groups[i]` is episode i's group) and their segments."""

    episodes: list[Episode]
    groups: list[int]
    segments: list[Segment]
    sampling_seconds: float
    seconds: float
    batches: int
    acceptance_length: float | None = None  # speculative sampling: tokens per verification


class Lockstep:
    """Collects the model calls of concurrent episodes and samples them together.

    Episode `i` calls `view(i).generate(...)`; the call waits until every live episode has a
    call waiting (an episode that ends calls `done(i)`), then the waiting calls are sampled in
    one `policy.generate_batch` call ordered by episode index. `policy` is a `rl.JaxPolicy`
    (or anything with its `generate_batch` and `last_output`).
    """

    def __init__(self, policy: Any, episodes: int, *, seed: int, chunk: int = 0):
        self.policy, self.seed, self.chunk = policy, seed, chunk
        self._cond = threading.Condition()
        self._live = set(range(episodes))
        self._waiting: dict[int, tuple[list, list, hx.SamplingParams]] = {}
        self._results: dict[int, Any] = {}
        self.records: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
            i: [] for i in range(episodes)
        }
        self.batches, self.sampling_seconds = 0, 0.0
        self.outputs: list[Any] = []  # the speculative sampler calls' outputs (acceptance)

    def view(self, episode: int) -> _View:
        return _View(self, episode)

    def generate(self, episode: int, messages, tools, sampling) -> hx.AssistantTurn:
        with self._cond:
            self._waiting[episode] = (list(messages), list(tools), sampling)
            self._maybe_sample()
            while episode not in self._results:
                self._cond.wait()
            result = self._results.pop(episode)
        if isinstance(result, Exception):
            raise result
        return result

    def done(self, episode: int) -> None:
        with self._cond:
            self._live.discard(episode)
            self._maybe_sample()

    def _maybe_sample(self) -> None:
        """Samples the waiting calls once every live episode waits (lock held)."""
        if not self._waiting or not self._live <= set(self._waiting):
            return
        order = sorted(self._waiting)
        calls = [self._waiting.pop(i) for i in order]
        size = self.chunk or len(order)
        start = time.perf_counter()
        for c, first in enumerate(range(0, len(order), size)):
            seed = _seed("batch", self.seed, self.batches, c) % 2**31
            sampling = dataclasses.replace(calls[first][2], seed=seed)
            self._sample(order[first : first + size], calls[first : first + size], sampling)
        self.batches += 1
        self.sampling_seconds += time.perf_counter() - start
        self._cond.notify_all()

    def _sample(self, order, calls, sampling) -> None:
        """One `generate_batch` call for the episodes `order` (lock held)."""
        try:
            turns = self.policy.generate_batch([(m, t) for m, t, _ in calls], sampling)
            out = self._output()
            for row, i in enumerate(order):
                n = int(out.lengths[row])
                self.records[i].append((np.asarray(out.prompts[row], np.int32),
                                        np.asarray(out.tokens[row, :n], np.int32),
                                        np.asarray(out.policy_logprobs[row, :n], np.float32)))  # fmt: skip
                self._results[i] = turns[row]
        except hx.PolicyError:  # e.g. one prompt too long: sample the rows one by one
            for i, (messages, tools, _) in zip(order, calls, strict=True):
                self._results[i] = self._one(i, messages, tools, sampling)
        except Exception as err:  # noqa: BLE001 - every waiting episode sees the failure
            for i in order:
                self._results[i] = err

    def _one(self, i, messages, tools, sampling):
        try:
            turn = self.policy.generate_batch([(messages, tools)], sampling)[0]
        except hx.PolicyError as err:
            return err
        out = self._output()
        n = int(out.lengths[0])
        self.records[i].append((np.asarray(out.prompts[0], np.int32),
                                np.asarray(out.tokens[0, :n], np.int32),
                                np.asarray(out.policy_logprobs[0, :n], np.float32)))  # fmt: skip
        return turn

    def _output(self):
        """The policy's last sampler output, kept when it carries acceptance figures."""
        out = self.policy.last_output
        if getattr(out, "acceptance_length", None) is not None:
            self.outputs.append(out)
        return out

    @property
    def acceptance_length(self) -> float | None:
        """The acceptance length of every speculative call so far, pooled (None if none)."""
        return combine_acceptance(self.outputs) if self.outputs else None


@dataclasses.dataclass
class _Call:
    """A model call waiting for (or holding) a slot of a `Continuous` decoder."""

    episode: int
    prompt: list[int]
    budget: int
    settings: Any  # models.Sampling
    seed: int
    future: concurrent.futures.Future
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)


class Continuous:
    """The model calls of concurrent episodes decoded with continuous batching.

    The `Lockstep`'s alternative (`rollout(..., decoder=...)`): episode `i` calls
    `view(i).generate(...)`, which renders its prompt and queues it; one thread (`serve`, the
    rollout's own) admits queued calls into the free slots of a `models.SlotDecoder` between
    decode steps and hands each call its tokens as soon as its row ends. So an episode whose
    call is short runs its tools and Hooks and sends its next call while the others decode,
    instead of waiting at a barrier for the slowest row of a round.

    Each call samples with its own seed, `_seed("call", seed, episode, round)` (the decoder
    draws the k-th token of a row from `fold_in(key(seed), k)`), so a call's tokens are a
    function of the weights, its prompt and that seed, whichever calls decode beside it and
    whatever the threads' timing (up to floating-point differences between the programs of
    different slot counts). Log-probs are the decoder's, under the unmodified policy.
    """

    def __init__(self, policy: Any, decoder: Any, episodes: int, *, seed: int):
        self.policy, self.decoder, self.seed = policy, decoder, seed
        self._queue: queue.Queue = queue.Queue()
        self._live = episodes
        self._lock = threading.Lock()
        self._failed: BaseException | None = None
        self.records: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
            i: [] for i in range(episodes)
        }
        self.batches, self.sampling_seconds = 0, 0.0  # decode calls (admissions and steps)

    def view(self, episode: int) -> _View:
        return _View(self, episode)

    def generate(self, episode: int, messages, tools, sampling) -> hx.AssistantTurn:
        policy = self.policy
        prompt = policy.prompt_ids(messages, tools, enable_thinking=sampling.enable_thinking)
        budget = policy._budget(prompt, sampling.max_tokens)  # PolicyError: no room
        rounds = sum(1 for m in messages if m.get("role") == "assistant")
        call = _Call(episode, prompt, budget, policy._settings(sampling),
                     _seed("call", self.seed, episode, rounds) % 2**31,
                     concurrent.futures.Future())  # fmt: skip
        with self._lock:
            if self._failed is not None:
                raise self._failed
            self._queue.put(call)
        call.future.result()  # the decoder's error, if it failed
        completion = np.asarray(call.tokens, np.int32)
        logprobs = np.asarray(call.logprobs, np.float32)
        self.records[episode].append((np.asarray(prompt, np.int32), completion, logprobs))
        return policy.turn(completion, logprobs, messages, tools,
                           enable_thinking=sampling.enable_thinking)  # fmt: skip

    def done(self, episode: int) -> None:
        with self._lock:
            self._live -= 1
        self._queue.put(None)  # wakes `serve`

    def serve(self) -> None:
        """Decodes the episodes' calls until every episode is done (on the calling thread).
        If decoding fails, every waiting call gets the error and it is raised here."""
        waiting: collections.deque[_Call] = collections.deque()
        rows: dict[int, _Call] = {}
        try:
            while True:
                with self._lock:
                    finished = self._live == 0
                if finished and not waiting and not rows:
                    return
                block = not waiting and not rows  # nothing to decode: wait for a call
                while True:
                    try:
                        item = self._queue.get(block=block)
                    except queue.Empty:
                        break
                    if item is not None:
                        waiting.append(item)
                    block = False
                self._admit(waiting, rows)
                if rows:
                    self._step(rows)
        except BaseException as err:
            for call in [*waiting, *rows.values()]:
                if not call.future.done():
                    call.future.set_exception(err)
            self._fail_queued(err)
            raise

    def _fail_queued(self, err: BaseException) -> None:
        """Fails the calls still queued, and every later one (their episodes end)."""
        with self._lock:
            self._failed = err
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and not item.future.done():
                item.future.set_exception(err)

    def _admit(self, waiting: collections.deque, rows: dict[int, _Call]) -> None:
        for slot in self.decoder.free_slots():
            if not waiting:
                return
            call = waiting[0]
            start = time.perf_counter()
            first = self.decoder.admit(slot, call.prompt, max_new_tokens=call.budget,
                                       sampling=call.settings, seed=call.seed)  # fmt: skip
            waiting.popleft()  # admitted (on an error it stays, and `serve` fails it)
            self.sampling_seconds += time.perf_counter() - start
            self.batches += 1
            call.tokens += first.tokens_of(0)
            call.logprobs += first.policy_logprobs_of(0)
            if first.finished[0]:
                call.future.set_result(None)
            else:
                rows[slot] = call

    def _step(self, rows: dict[int, _Call]) -> None:
        start = time.perf_counter()
        out = self.decoder.step()
        self.sampling_seconds += time.perf_counter() - start
        self.batches += 1
        for slot in np.flatnonzero(out.emitted.any(1)):
            call = rows[int(slot)]
            call.tokens += out.tokens_of(int(slot))
            call.logprobs += out.policy_logprobs_of(int(slot))
            if out.finished[slot]:
                del rows[int(slot)]
                call.future.set_result(None)

    @property
    def acceptance_length(self) -> None:
        return None  # the slot decoder decodes plainly


class _View:
    """Episode `i`'s handle on a `Lockstep` or `Continuous`: a `hat_jax.harness.PolicyModel`."""

    inline = True  # the loop calls it on the episode's own thread

    def __init__(self, lockstep: Lockstep, episode: int):
        self.lockstep, self.episode = lockstep, episode

    def generate(self, messages, tools, sampling=None) -> hx.AssistantTurn:
        return self.lockstep.generate(
            self.episode, messages, tools, sampling or hx.SamplingParams()
        )


def rollout(
    room: LiveRoom,
    policy: Any,
    *,
    scenarios: int,
    group_size: int,
    seed: int,
    sampling: hx.SamplingParams,
    count_tokens=None,
    chunk: int = 0,
    decoder: Any = None,
) -> Rollouts:
    """Runs `scenarios` x `group_size` episodes together and returns their segments.

    Args:
      room: the live room (scenario split, HSA, faults, loop limits, rewarder).
      policy: a `rl.JaxPolicy` holding the current weights.
      scenarios: rollout groups per step; group_size: episodes per group (G).
      seed: the step's seed: scenarios, Harness states, faults and sampling derive from it.
      sampling: temperature, top-p and the per-call token budget (`max_tokens`).
      count_tokens: reasoning length in tokens (default: the policy's tokenizer).
      chunk: conversations per sampler call at a barrier (0: all of them at once).
      decoder: a `models.SlotDecoder` over the policy's current weights: the calls are decoded
        with continuous batching (`Continuous`) instead of at a barrier (`Lockstep`).
    """
    start = time.perf_counter()
    specs = []  # (group, scenario, state, member seed)
    for g in range(scenarios):
        scenario = room.sample(_seed("rl-scenario", seed, g))
        state, _ = room.state_for(scenario, _seed("rl-state", seed, g))
        specs += [(g, scenario, state, _seed("rl-member", seed, g, k)) for k in range(group_size)]
    if decoder is None:
        lockstep = Lockstep(policy, len(specs), seed=seed, chunk=chunk)
    else:
        lockstep = Continuous(policy, decoder, len(specs), seed=seed)

    def run(i: int) -> Episode:
        g, scenario, state, member = specs[i]
        try:
            return room.run(lockstep.view(i), scenario, seed=member, state=state,
                            sampling=dataclasses.replace(sampling, seed=member % 2**31))  # fmt: skip
        finally:
            lockstep.done(i)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(specs)) as pool:
        running = [pool.submit(run, i) for i in range(len(specs))]
        if decoder is not None:
            lockstep.serve()
        episodes = [r.result() for r in running]
    if count_tokens is None:
        tokenizer = policy.tokenizer
        count_tokens = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    segments = []
    for i, episode in enumerate(episodes):
        parts = episode_segments(episode.trajectory, episode.rewards, count_tokens=count_tokens)
        records = lockstep.records[i]
        if len(records) != len(parts):
            raise RuntimeError(
                f"episode {i}: {len(records)} sampled calls but {len(parts)} model calls with "
                "output (a policy call outside the lockstep?)"
            )
        for k, (prompt, completion, logprobs) in enumerate(records):
            segments.append(Segment(episode=i, group=specs[i][0], round=int(parts.rounds[k]),
                                    kind=int(parts.kinds[k]),
                                    cot_length=int(parts.cot_lengths[k]), prompt=prompt,
                                    completion=completion, logprobs=logprobs))  # fmt: skip
    return Rollouts(
        episodes=episodes,
        groups=[s[0] for s in specs],
        segments=segments,
        sampling_seconds=lockstep.sampling_seconds,
        seconds=time.perf_counter() - start,
        batches=lockstep.batches,
        acceptance_length=lockstep.acceptance_length,
    )


def segment_rewards(rollouts: Rollouts) -> np.ndarray:
    """f32[S, 4] each segment's episode rewards (`REWARD_DIMS` order)."""
    return np.stack([rollouts.episodes[s.episode].rewards.as_array() for s in rollouts.segments])


def rows(
    segments: Sequence[Segment], advantages: np.ndarray, *, seq_len: int, pad_id: int
) -> tuple[dict[str, np.ndarray], int]:
    """One training row per segment: prompt then completion (`loss_mask` 1 on the completion
    only), `old_logprobs` aligned with the tokens, the segment's advantage on every token.
    Segments longer than `seq_len` are left out (never cut) and counted.

    Returns `(rows, dropped)`; the rows' keys are `ROW_KEYS`.
    """
    keep = [
        (s, a) for s, a in zip(segments, advantages, strict=True)
        if len(s.prompt) + len(s.completion) <= seq_len
    ]  # fmt: skip
    n = len(keep)
    out = {
        "input_ids": np.full((n, seq_len), pad_id, np.int32),
        "loss_mask": np.zeros((n, seq_len), np.int32),
        "segment_ids": np.zeros((n, seq_len), np.int32),
        "positions": np.zeros((n, seq_len), np.int32),
        "old_logprobs": np.zeros((n, seq_len), np.float32),
        "advantages": np.zeros((n, seq_len), np.float32),
    }
    for r, (s, a) in enumerate(keep):
        p, c = len(s.prompt), len(s.completion)
        out["input_ids"][r, :p] = s.prompt
        out["input_ids"][r, p : p + c] = s.completion
        out["loss_mask"][r, p : p + c] = 1
        out["old_logprobs"][r, p : p + c] = s.logprobs
        out["segment_ids"][r, : p + c] = 1
        out["positions"][r, : p + c] = np.arange(p + c)
        out["advantages"][r, : p + c] = a
    return out, len(segments) - n


ROW_KEYS = ("input_ids", "loss_mask", "segment_ids", "positions", "old_logprobs", "advantages")
