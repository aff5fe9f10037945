"""Rollouts of a frozen policy for MTP draft-head adaptation, and the pool the trainer reads.

The adaptation stage trains the draft head on what the *policy* writes (paper App. H): prompts
from the data pipeline (e.g. `data.opd_prompt_data` batches: `prompt_ids [b, P]` right-padded,
`prompt_lengths [b]`) are continued by `models.Sampler`, and each prompt + completion becomes
one training row with the sampled-token mask as its loss mask, so only tokens the policy
produced are ever predicted. No reward is involved.

`RolloutPool` holds those rows and serves them as a `hat_jax.train.DataSource`: a fixed number
of rows per step, reshuffled every epoch from the seed, resumable from `get_state()`. Pools are
saved as `.npz` files (atomically) so a resumed run trains on the very same rollouts.

In a job of several processes every process's prompt rows are gathered and sampled as one
batch on every process, so every process holds the whole pool (process 0 writes it); a
batch is the global batch of a single process, of which each process returns its share.
The position is the same on every process, so it resumes under another process count.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

import models
from hat_jax import files
from hat_jax.sharding import all_process_rows, process_rows
from hat_jax.train import BATCH_KEYS, shared_state


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How the frozen policy is sampled for the adaptation stage.

    Attributes:
      batches: sampler calls (prompt batches) for the training pool.
      eval_batches: sampler calls on held-out prompts for the before/after metrics.
      max_new_tokens: completion length limit per row.
      temperature, top_k, top_p: the policy's sampling settings (the deployment ones: the
        head is judged on the distribution it will draft for).
      seed: sampler seed; call i of the training pool uses `seed + i`, held-out calls
        `seed + 100_003 + i`.
      decode_moe_dispatch: MoE dispatch of the per-token decode steps ("" keeps the model's;
        "dense" is fastest for tiny CPU models, whose sorted dispatch pads each step's
        handful of tokens to whole blocks).
    """

    batches: int = 8
    eval_batches: int = 2
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    decode_moe_dispatch: str = ""

    def __post_init__(self):
        bad = {k: getattr(self, k) for k in ("batches", "eval_batches", "max_new_tokens")
               if getattr(self, k) < 1}  # fmt: skip
        if bad:
            raise ValueError(f"RolloutConfig: values must be >= 1: {bad}")
        self.sampling()  # validates temperature / top_k / top_p

    def decode_overrides(self) -> dict[str, str] | None:
        return {"moe_dispatch": self.decode_moe_dispatch} if self.decode_moe_dispatch else None

    def sampling(self) -> models.Sampling:
        return models.Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


def prompts_from_rows(
    rows: Iterator[Mapping[str, np.ndarray]],
    *,
    batch_size: int,
    max_prompt_len: int,
    pad_id: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Prompt batches (`prompt_ids`, `prompt_lengths`) cut from training rows.

    A row of `data.sft_data` (packed or not) starts with a document whose loss mask is 0 up to
    the first token the assistant wrote; everything before it is exactly the prompt that turn
    was generated from (the generation-prompt header included). So the agent's own traffic
    (Harness system prompt, tools, history) can prompt the rollouts. Rows whose first
    document trains nothing, or whose prompt is longer than `max_prompt_len`, are skipped.
    """
    pending: list[np.ndarray] = []
    for batch in rows:
        for ids, mask, seg in zip(batch["input_ids"], batch["loss_mask"], batch["segment_ids"]):
            first = np.flatnonzero((np.asarray(mask) > 0) & (np.asarray(seg) == seg[0]))
            if seg[0] == 0 or not len(first) or not 0 < first[0] <= max_prompt_len:
                continue
            pending.append(np.asarray(ids[: first[0]], np.int32))
            if len(pending) == batch_size:
                out = np.full((batch_size, max_prompt_len), pad_id, np.int32)
                for i, prompt in enumerate(pending):
                    out[i, : len(prompt)] = prompt
                lengths = np.asarray([len(q) for q in pending], np.int32)
                pending = []
                yield {"prompt_ids": out, "prompt_lengths": lengths}


def _prompt_lists(batch: Mapping[str, np.ndarray]) -> list[list[int]]:
    ids, lengths = np.asarray(batch["prompt_ids"]), np.asarray(batch["prompt_lengths"])
    return [ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]


def _prompt_arrays(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if "prompt_ids" not in batch or "prompt_lengths" not in batch:
        raise ValueError(
            f"rollouts: a prompt batch needs 'prompt_ids' and 'prompt_lengths', got {sorted(batch)}"
        )
    return {k: np.asarray(batch[k]) for k in ("prompt_ids", "prompt_lengths")}


def generate_rollouts(
    sampler: models.Sampler,
    prompts: Iterator[Mapping[str, np.ndarray]],
    *,
    count: int,
    config: RolloutConfig,
    seq_len: int,
    stop_tokens: tuple[int, ...] = (),
    seed_offset: int = 0,
) -> dict[str, np.ndarray]:
    """Samples `count` prompt batches and returns their rows (`BATCH_KEYS`, [N, seq_len]),
    `prompt_lengths` [N] and the counts `rollouts`, `sampled_tokens`, `stopped`.

    Raises:
      ValueError: the prompts run out, or a prompt plus `max_new_tokens` exceeds `seq_len`.
    """
    rows: list[dict[str, np.ndarray]] = []
    stats = {"rollouts": 0, "sampled_tokens": 0, "stopped": 0}
    for i in range(count):
        try:
            batch = next(prompts)
        except StopIteration:
            raise ValueError(
                f"rollouts: the prompt source ended after {i} of {count} batches"
            ) from None
        lists = _prompt_lists(all_process_rows(_prompt_arrays(batch)))
        longest = max(len(p) for p in lists) + config.max_new_tokens
        if longest > seq_len:
            raise ValueError(
                f"rollouts: a prompt of {longest - config.max_new_tokens} tokens plus "
                f"max_new_tokens={config.max_new_tokens} exceeds trainer.seq_len={seq_len}"
            )
        out = sampler(lists, max_new_tokens=config.max_new_tokens, sampling=config.sampling(),
                      stop_tokens=stop_tokens, seed=config.seed + seed_offset + i)  # fmt: skip
        laid = out.rows(seq_len)
        laid["loss_mask"] = laid.pop("sampled_mask")
        laid["prompt_lengths"] = np.asarray([len(p) for p in lists])
        rows.append({k: laid[k].astype(np.int32) for k in (*BATCH_KEYS, "prompt_lengths")})
        stats["rollouts"] += len(lists)
        stats["sampled_tokens"] += int(out.lengths.sum())
        stats["stopped"] += int(out.stopped.sum())
    pool = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    pool.update({k: np.asarray(v, np.int64) for k, v in stats.items()})
    return pool


def save_pool(path: os.PathLike | str, pool: Mapping[str, np.ndarray]) -> pathlib.Path:
    """Writes a rollout pool as `.npz`, atomically (process 0 only: every process holds the
    same pool)."""
    if jax.process_index() != 0:
        return pathlib.Path(path)
    with files.atomic_open(path, "wb") as f:
        np.savez(f, **pool)
    return pathlib.Path(path)


def load_pool(path: os.PathLike | str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


class RolloutPool:
    """Rollout rows served `batch_size` at a time, reshuffled each epoch (a `DataSource`).

    Args:
      pool: arrays with `BATCH_KEYS` ([N, T] each), e.g. from `generate_rollouts`.
      batch_size: rows per batch (global: each process returns its share of them).
      seed: shuffling seed.
      shuffle: reshuffle every epoch (else the pool order, e.g. for evaluation).
    """

    resplits_states = True  # every process holds the same position

    def __init__(self, pool: Mapping[str, np.ndarray], *, batch_size: int, seed: int = 0,
                 shuffle: bool = True):  # fmt: skip
        self.rows = {k: np.asarray(pool[k], np.int32) for k in BATCH_KEYS}
        self.size = len(self.rows["input_ids"])
        if batch_size < 1 or batch_size > self.size:
            raise ValueError(f"RolloutPool: batch_size {batch_size} for a pool of {self.size} rows")
        if batch_size % jax.process_count():
            raise ValueError(
                f"RolloutPool: batch_size {batch_size} does not split over "
                f"{jax.process_count()} processes"
            )
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self._next = 0  # rows served so far

    def __iter__(self) -> RolloutPool:
        return self

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def __next__(self) -> dict[str, np.ndarray]:
        picks = []
        for n in range(self._next, self._next + self.batch_size):
            epoch, index = divmod(n, self.size)
            picks.append(self._order(epoch)[index])
        self._next += self.batch_size
        return process_rows({k: v[np.asarray(picks)] for k, v in self.rows.items()})

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """One pass over the pool in order (whole batches only), e.g. for evaluation."""
        for start in range(0, self.size - self.batch_size + 1, self.batch_size):
            yield process_rows(
                {k: v[start : start + self.batch_size] for k, v in self.rows.items()}
            )

    def get_state(self) -> dict[str, Any]:
        return {"next_row": self._next, "rows": self.size, "seed": self.seed}

    def set_state(self, state: Mapping[str, Any] | list[Mapping[str, Any]]) -> None:
        """Restores a position: this pool's own, or every process's of a run with another
        process count (all equal)."""
        state = shared_state(state, "RolloutPool")
        if int(state["rows"]) != self.size or int(state["seed"]) != self.seed:
            raise ValueError(
                f"RolloutPool: state for {state['rows']} rows / seed {state['seed']}, this pool "
                f"has {self.size} rows / seed {self.seed}"
            )
        self._next = int(state["next_row"])
