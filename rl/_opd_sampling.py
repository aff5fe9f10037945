"""The on-policy side of General OPD: the student's sampler, the batch source that samples each
step with the current weights (`OPDSource`), and the held-out evaluation (`HeldOutEvaluation`:
exact KL to the teacher, response lengths, instruction pass rates, sample responses)."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

import models
from data import Instruction, check_constraints, pass_rates
from hat_jax import chat_format, files
from hat_jax.sharding import all_process_rows, process_rows
from hat_jax.train import BATCH_KEYS, StageDriver, TrainState


class StudentSampler:
    """`models.Sampler` over the student's current weights: built on first use, then given
    each step's weights with `update` (no recompilation). With `chunk` > 0 a call samples
    that many prompts at a time (the caches of a whole step's batch may not fit beside the
    train state; see `launch.plan`). With `num_draft_tokens` > 0 it samples
    self-speculatively with `draft_head` (the same distribution, fewer decode steps when the
    head predicts the student well; the head stays fixed while the student trains)."""

    def __init__(self, *, pad_id: int, stop_tokens: Sequence[int], decode_overrides=None,
                 chunk: int = 0, draft_head: models.MTPHead | None = None,
                 num_draft_tokens: int = 0):  # fmt: skip
        if num_draft_tokens and draft_head is None:
            raise ValueError(
                f"StudentSampler: num_draft_tokens={num_draft_tokens} needs an MTP draft head"
            )
        self.pad_id, self.stop_tokens = pad_id, tuple(stop_tokens)
        self.decode_overrides, self.chunk = decode_overrides, chunk
        self.draft_head, self.num_draft_tokens = draft_head, num_draft_tokens
        self.sampler: models.Sampler | None = None

    def __call__(self, policy: models.Qwen, prompts, *, max_new_tokens, sampling, seed):
        if self.sampler is None:
            self.sampler = models.Sampler(
                policy, pad_id=self.pad_id, decode_overrides=self.decode_overrides,
                mtp=self.draft_head if self.num_draft_tokens else None,
                num_draft_tokens=self.num_draft_tokens,
            )  # fmt: skip
        else:
            self.sampler.update(model=policy)
        size = self.chunk or len(prompts)
        outs = []
        for i, start in enumerate(range(0, len(prompts), size)):
            key = seed if size >= len(prompts) else jax.random.fold_in(seed, i)
            outs.append(self.sampler(prompts[start : start + size], max_new_tokens=max_new_tokens,
                                     sampling=sampling, stop_tokens=self.stop_tokens, seed=key))  # fmt: skip
        return outs[0] if len(outs) == 1 else _concatenate(outs)


def _concatenate(outs: Sequence[models.SampleOutput]) -> models.SampleOutput:
    """One `SampleOutput` of several calls' rows, in order."""
    cat = lambda name: np.concatenate([getattr(o, name) for o in outs])  # noqa: E731
    return models.SampleOutput(
        prompts=sum((o.prompts for o in outs), ()), tokens=cat("tokens"), lengths=cat("lengths"),
        logprobs=cat("logprobs"), policy_logprobs=cat("policy_logprobs"),
        stopped=cat("stopped"), pad_id=outs[0].pad_id,
        acceptance_length=models.combine_acceptance(outs),
        verifications=sum(o.verifications for o in outs),
    )  # fmt: skip


def _prompt_lists(batch: Mapping[str, np.ndarray]) -> list[list[int]]:
    ids, lengths = np.asarray(batch["prompt_ids"]), np.asarray(batch["prompt_lengths"])
    return [ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]


def _rows(out: models.SampleOutput, seq_len: int) -> dict[str, np.ndarray]:
    rows = out.rows(seq_len)
    rows["loss_mask"] = rows.pop("sampled_mask")
    return {k: rows[k].astype(np.int32) for k in BATCH_KEYS}


class OPDSource:
    """The on-policy batch source: each batch is one response per prompt, sampled with the
    student's current weights (an `hat_jax.train.OnPolicySource`).

    In a job of several processes each reads its own prompt rows; the step's prompts of
    every process are gathered, sampled as one batch on every process (one program over the
    job's devices), and each keeps its own rows: the global batch a single process would
    sample. Its position therefore re-splits (`resplits_states`): a checkpoint of n
    processes resumes under m when the prompts' data shards allow it.

    Args:
      prompts: prompt batches (`prompt_ids`, `prompt_lengths`; e.g. `data.opd_prompt_data`)
        with `get_state` / `set_state`; `stats()["too_long"]`, if it has `stats`, is reported
        as the prompts dropped so far.
      sampler: the student's sampler.
      config: the stage config (sampling settings, lengths).
      seed: sampling seed; call n samples with `fold_in(key(seed), n)`, so a resumed run
        draws exactly what an uninterrupted one would.
    """

    resplits_states = True

    def __init__(self, prompts, *, sampler: StudentSampler, config: Any, seed: int):
        self.prompts, self.sampler, self.config, self.seed = prompts, sampler, config, seed
        self.calls = 0

    def next_batch(self, model) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        batch = next(self.prompts)
        keys = ("prompt_ids", "prompt_lengths")
        lists = _prompt_lists(all_process_rows({k: batch[k] for k in keys}))
        start = time.perf_counter()
        key = jax.random.fold_in(jax.random.key(self.seed), self.calls)
        out = self.sampler(model.policy, lists, max_new_tokens=self.config.max_new_tokens,
                           sampling=self.config.sampling(), seed=key)  # fmt: skip
        self.calls += 1
        lengths = np.asarray(out.lengths, np.float64)
        figures = {
            "sampling_seconds": time.perf_counter() - start,
            "responses": float(len(lists)),
            "response_length": float(lengths.mean()),
            "response_length_max": float(lengths.max()),
            "stopped": float(np.mean(out.stopped)),
            "prompt_length": float(np.mean([len(p) for p in lists])),
            # programs the sampler compiled so far: one per length bucket, never one per step
            "sampler_programs": float(self.sampler.sampler.compilations),
        }
        if out.acceptance_length is not None:  # speculative: tokens per verification
            figures["acceptance_length"] = float(out.acceptance_length)
        if hasattr(self.prompts, "stats"):
            figures["dropped_prompts"] = float(self.prompts.stats().get("too_long", 0))
        return process_rows(_rows(out, self.config.trainer.seq_len)), figures

    def get_state(self) -> dict[str, Any]:
        return {"prompts": self.prompts.get_state(), "calls": self.calls, "seed": self.seed}

    def set_state(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Restores a position: this source's own state, or the list of every process's
        states of a run with another process count (the prompts re-split theirs)."""
        states = list(state) if isinstance(state, Sequence) else [state]
        for s in states:
            if int(s["seed"]) != self.seed:
                raise ValueError(
                    f"OPDSource: state for seed {s['seed']}, this source has {self.seed}"
                )
        calls = {int(s["calls"]) for s in states}
        if len(calls) != 1:
            raise ValueError(f"OPDSource: the processes' states disagree on calls {calls}")
        prompts = [s["prompts"] for s in states]
        if isinstance(state, Sequence):
            if not getattr(self.prompts, "resplits_states", False):
                raise ValueError(
                    f"OPDSource: its prompts ({type(self.prompts).__name__}) cannot re-split "
                    "a position saved by another process count"
                )
            self.prompts.set_state(prompts)
        else:
            self.prompts.set_state(prompts[0])
        self.calls = calls.pop()


# -- evaluation ----------------------------------------------------------------------------------


class HeldOutEvaluation:
    """The held-out figures of the student: exact KL to the teacher, response lengths, and the
    pass rates of the instructions' constraints (an `hat_jax.train.Evaluation`).

    Args:
      driver: the stage's driver (its models and compiled eval step).
      sampler: the student's sampler.
      instructions: the held-out instructions (never trained on).
      tokenizer: renders prompts and decodes responses.
      config: the stage config.
      run_dir: sample responses go to `<run_dir>/samples/step_<n>.jsonl`.
    """

    def __init__(self, driver: StageDriver, sampler: StudentSampler,
                 instructions: Sequence[Instruction], tokenizer, config: Any,
                 run_dir: pathlib.Path):  # fmt: skip
        self.driver, self.sampler, self.tokenizer, self.config = driver, sampler, tokenizer, config
        self.run_dir = run_dir
        items = list(instructions)
        if config.eval_max_prompts:
            items = items[: config.eval_max_prompts]
        self.items, self.prompts, self.dropped = [], [], 0
        for instruction in items:
            ids = chat_format.render_tokens(
                list(instruction.messages), tokenizer, add_generation_prompt=True,
                enable_thinking=config.enable_thinking,
            ).ids  # fmt: skip
            if len(ids) > config.max_prompt_len:
                self.dropped += 1
                continue
            self.items.append(instruction)
            self.prompts.append(list(ids))
        if not self.prompts:
            raise ValueError(
                f"OPD evaluation: none of the {len(items)} held-out prompts fits "
                f"max_prompt_len={config.max_prompt_len}"
            )

    def _batches(self, rows: Mapping[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """The rows (every process samples them all) as whole batches of
        `trainer.batch_size`, the last padded with empty rows, which weigh nothing; each
        process passes its share of every batch."""
        size = self.config.trainer.batch_size
        n = len(rows["input_ids"])
        for start in range(0, n, size):
            chunk = {k: v[start : start + size] for k, v in rows.items()}
            short = size - len(chunk["input_ids"])
            if short:
                chunk = {k: np.concatenate([v, np.zeros((short, v.shape[1]), v.dtype)])
                         for k, v in chunk.items()}  # fmt: skip
            yield process_rows(chunk)

    def __call__(self, state: TrainState) -> dict[str, float]:
        model = self.driver.model(state)
        out = self.sampler(model.policy, self.prompts, max_new_tokens=self.config.max_new_tokens,
                           sampling=self.config.eval_sampling(), seed=jax.random.key(0))  # fmt: skip
        rows = _rows(out, self.config.trainer.seq_len)
        kl = self.driver.evaluate([self.driver.loss_evaluation(lambda: self._batches(rows))], state)
        texts = [self.tokenizer.decode(out.completion(i), skip_special_tokens=False)
                 for i in range(len(self.prompts))]  # fmt: skip
        replies = [chat_format.parse(t, enable_thinking=self.config.enable_thinking).content
                   for t in texts]  # fmt: skip
        rates = pass_rates(replies, [list(i.constraints) for i in self.items])
        n = len(self.prompts)
        figures = {
            "kl": kl["kl"],
            "kl_per_response": kl["kl"] * kl["weight"] / n,
            "response_length": float(np.mean(out.lengths)),
            "stopped": float(np.mean(out.stopped)),
            "prompts": float(n),
        }
        figures |= {
            f"pass_{k}": v for k, v in rates.items() if k not in ("prompts", "instructions")
        }
        self._write_samples(int(jax.device_get(state.step)), texts, replies, figures)
        return figures

    def _write_samples(self, step: int, texts, replies, figures) -> None:
        if jax.process_index() != 0 or not self.config.eval_samples:
            return
        records = []
        for i in range(min(self.config.eval_samples, len(texts))):
            constraints = list(self.items[i].constraints)
            records.append({
                "id": self.items[i].id,
                "prompt": self.items[i].messages[-1]["content"],
                "response": texts[i],
                "reply": replies[i],
                "constraints": constraints,
                "strict": check_constraints(replies[i], constraints),
                "loose": check_constraints(replies[i], constraints, loose=True),
            })  # fmt: skip
        lines = [json.dumps(r, ensure_ascii=False) for r in records]
        files.write_jsonl(self.run_dir / "samples" / f"step_{step}.jsonl", lines)
