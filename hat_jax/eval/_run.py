"""The evaluation runner: any policy over versioned sets, per-item results, resumable.

    policy = eval.BatchedPolicy(rl.JaxPolicy(model, tokenizer), describe={...})
    summary = eval.evaluate([t1, t2, general], policy, ctx=eval.EvalContext.default(),
                            run_dir="runs/eval/sft", config=eval.RunConfig())

Three ways to drive a policy:
- `BatchedPolicy`: a local JAX policy (`rl.JaxPolicy`). `RunConfig.batch_size` items run
  together, each on its own thread through the real agent loop, and their model calls are
  decoded in one batch per round (`rl.Lockstep`), so a set costs a few batched decodes per
  round instead of one decode per call; or, with `engine="slots"`, with continuous batching
  (`rl.Continuous`: no item waits for the slowest call of a round).
- `FactoryPolicy`: a policy built per item from its Harness state (the scripted teacher, the
  offline rule policy).
- `EndpointPolicy`: one shared `PolicyModel` (e.g. `OpenAICompatPolicy` for an SGLang server or
  a hosted model), `RunConfig.concurrency` items in flight; the endpoint is probed first, so an
  unreachable one is an error that names it rather than a set of zero scores.

Items are processed in fixed chunks of `batch_size`; each finished chunk is appended to
`items/<set>.jsonl` in one atomic write, so a crash loses at most the chunk in flight and a rerun
with the same run directory resumes without redoing finished items (chunks keep their
composition, so the resumed run decodes exactly what an uninterrupted one would). A run
directory belongs to one version of each set: resuming against another version is refused.
`summary.json` (means per set, metric and family; policy errors; the live room, Harness version
and judge of the run) is rewritten after each set. Every set must belong to the context's room.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hat_jax import files
from hat_jax import harness as hx
from hat_jax.eval._items import (
    DEFAULT_ROOM,
    EvalItem,
    EvalSet,
    SetVersionError,
    check_room,
    stable_seed,
)
from hat_jax.eval._kind import EvalContext, Prepared, SetKind, kind_name
from hat_jax.eval._names import name_counts, total_counts

SUMMARY_FILE = "summary.json"
ITEMS_DIR = "items"


class EvalError(RuntimeError):
    """The evaluation cannot proceed (an unreachable endpoint, a policy failing every call)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How a run decodes.

    Attributes:
      sampling: decoding settings of every model call (greedy by default: evaluation scores
        should not depend on a sampling draw).
      batch_size: items decoded together by a `BatchedPolicy` (and the chunk size in which
        results are written for every policy).
      concurrency: items in flight for an `EndpointPolicy`.
      seed: derives each chunk's sampling seed (irrelevant when greedy).
      keep_trajectories: write each item's whole trajectory (else only its scores and reply).
    """

    sampling: hx.SamplingParams = dataclasses.field(
        default_factory=lambda: hx.SamplingParams(
            temperature=0.0, top_p=1.0, max_tokens=256, enable_thinking=False
        )
    )
    batch_size: int = 16
    concurrency: int = 4
    seed: int = 0
    keep_trajectories: bool = True

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"RunConfig.batch_size must be >= 1, got {self.batch_size}")
        if self.concurrency < 1:
            raise ValueError(f"RunConfig.concurrency must be >= 1, got {self.concurrency}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampling": dataclasses.asdict(self.sampling),
            "batch_size": self.batch_size,
            "concurrency": self.concurrency,
            "seed": self.seed,
        }


Job = tuple[EvalItem, Prepared]


def _run_one(job: Job, model: hx.PolicyModel, ctx: EvalContext, sampling: hx.SamplingParams):
    item, prepared = job
    if item.agent:
        return hx.run_agent(prepared.state, prepared.request, model, prepared.tools,
                            limits=ctx.limits, sampling=sampling)  # fmt: skip
    return model.generate(list(prepared.messages), [], sampling)


ENGINES = ("lockstep", "slots")


class BatchedPolicy:
    """A local policy with `generate_batch` (an `rl.JaxPolicy`): items decoded together.

    Args:
      policy: the policy.
      describe: what the run records about it (kind, checkpoint, dtype ...).
      engine: "lockstep" (the items' calls of a round sampled in one batch, `rl.Lockstep`) or
        "slots" (continuous batching on a `models.SlotDecoder` of `RunConfig.batch_size`
        slots, `rl.Continuous`: an item's call joins between decode steps and leaves when
        its row ends). Greedy, both give the same tokens.
    """

    def __init__(self, policy: Any, *, describe: Mapping[str, Any], engine: str = "lockstep"):
        if engine not in ENGINES:
            raise ValueError(f"BatchedPolicy: engine={engine!r}, choose one of {ENGINES}")
        self.policy, self.engine = policy, engine
        self.description = dict(describe) | ({"engine": engine} if engine != "lockstep" else {})
        self._decoder = None

    def run(self, jobs: Sequence[Job], ctx: EvalContext, config: RunConfig, seed: int) -> list:
        import rl  # rl builds on hat_jax; imported when a JAX policy runs

        if self.engine == "slots":
            if self._decoder is None or self._decoder.slots < len(jobs):
                slots = max(config.batch_size, len(jobs))
                self._decoder = rl.slot_decoder_for(self.policy, slots=slots)
            self._decoder.update(self.policy.model)
            calls = rl.Continuous(self.policy, self._decoder, len(jobs), seed=seed)
        else:
            calls = rl.Lockstep(self.policy, len(jobs), seed=seed)

        def run(i: int):
            try:
                return _run_one(jobs[i], calls.view(i), ctx, config.sampling)
            finally:
                calls.done(i)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            running = [pool.submit(run, i) for i in range(len(jobs))]
            if self.engine == "slots":
                calls.serve()
            return [r.result() for r in running]

    def check(self, config: RunConfig) -> None:
        del config


class FactoryPolicy:
    """A policy built for each item from its prepared state: `factory(prepared, ctx)`.

    `agent_only`: the policy answers live-room requests only (the scripted teacher, the rule
    policy); sets of single-call items are then skipped, and the summary says so.
    """

    def __init__(
        self,
        factory: Callable[[Prepared, EvalContext], hx.PolicyModel],
        *,
        describe: Mapping[str, Any],
        agent_only: bool = False,
    ):
        self.factory, self.description = factory, dict(describe)
        self.agent_only = agent_only

    def run(self, jobs: Sequence[Job], ctx: EvalContext, config: RunConfig, seed: int) -> list:
        out = []
        for k, job in enumerate(jobs):
            sampling = dataclasses.replace(config.sampling, seed=stable_seed(seed, k))
            out.append(_run_one(job, self.factory(job[1], ctx), ctx, sampling))
        return out

    def check(self, config: RunConfig) -> None:
        del config


class EndpointPolicy:
    """One shared policy (an OpenAI-compatible endpoint), `concurrency` items in flight."""

    def __init__(self, policy: hx.PolicyModel, *, describe: Mapping[str, Any]):
        self.policy, self.description = policy, dict(describe)

    def run(self, jobs: Sequence[Job], ctx: EvalContext, config: RunConfig, seed: int) -> list:
        def run(k: int):
            sampling = dataclasses.replace(config.sampling, seed=stable_seed(seed, k))
            return _run_one(jobs[k], self.policy, ctx, sampling)

        with concurrent.futures.ThreadPoolExecutor(max_workers=config.concurrency) as pool:
            return list(pool.map(run, range(len(jobs))))

    def check(self, config: RunConfig) -> None:
        """One tiny call; raises `EvalError` naming the endpoint when it fails."""
        probe = dataclasses.replace(config.sampling, max_tokens=1, seed=0)
        try:
            self.policy.generate([{"role": "user", "content": "ping"}], [], probe)
        except Exception as err:  # noqa: BLE001 - any failure of the probe stops the run
            where = self.description.get("endpoint", self.description)
            raise EvalError(f"the policy endpoint {where} does not answer: {err}") from err


EvalPolicy = BatchedPolicy | FactoryPolicy | EndpointPolicy


def _reply(result: Any) -> str:
    if isinstance(result, hx.Trajectory):
        final = result.final
        return final.public or final.private or ""
    return result.content or ""


def _policy_errors(result: Any) -> int:
    if isinstance(result, hx.Trajectory):
        return sum(f.kind == "policy_error" for f in result.faults)
    return 0


def _record(item: EvalItem, scores: Mapping[str, float], result: Any, seconds: float,
            keep: bool) -> dict[str, Any]:  # fmt: skip
    as_dict = result.to_dict() if isinstance(result, hx.Trajectory) else None
    trajectory = as_dict if keep else None
    if isinstance(result, hx.AssistantTurn):
        trajectory = {"reasoning": result.reasoning, "content": result.content} if keep else None
    record = {
        "id": item.id,
        "set": item.set,
        "family": item.family,
        "scores": {k: float(v) for k, v in scores.items()},
        "output": _reply(result),
        "policy_errors": _policy_errors(result),
        "trajectory": trajectory,
        "seconds": round(seconds, 4),
    }
    if as_dict is not None:
        record["names"] = name_counts(as_dict)  # copied or memorised names (`_names`)
    return record


def read_items(run_dir: os.PathLike | str, set_name: str) -> list[dict[str, Any]]:
    """The finished items of one set in a run directory (empty when none)."""
    path = pathlib.Path(run_dir) / ITEMS_DIR / f"{set_name}.jsonl"
    return files.read_jsonl(path, what="evaluation result") if path.is_file() else []


def read_summary(run_dir: os.PathLike | str) -> dict[str, Any]:
    """A run's `summary.json` (FileNotFoundError names the run directory)."""
    path = pathlib.Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no evaluation run ({SUMMARY_FILE} missing)")
    return json.loads(path.read_text(encoding="utf-8"))


def summarize(records: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    """Means per metric, overall and per family, of a set's per-item records (weighted by a
    record's `weights[metric]` where the set kind gives one, e.g. instruction counts)."""

    def mean(rows, m):
        w = [r.get("weights", {}).get(m, 1.0) for r in rows]
        return sum(wi * r["scores"][m] for wi, r in zip(w, rows, strict=True)) / sum(w)

    def means(rows):
        return {m: mean(rows, m) for m in metrics} if rows else {}

    families: dict[str, list] = {}
    for r in records:
        families.setdefault(r["family"], []).append(r)
    return {
        "n": len(records),
        "metrics": means(records),
        "families": {f: {"n": len(rows), **means(rows)} for f, rows in sorted(families.items())},
        "policy_errors": sum(r.get("policy_errors", 0) for r in records),
        "seconds": round(sum(r.get("seconds", 0.0) for r in records), 3),
        **({"names": names} if (names := total_counts(records)) else {}),
    }


def evaluate(
    sets: Sequence[EvalSet],
    policy: EvalPolicy,
    *,
    kinds: Mapping[str, SetKind],
    ctx: EvalContext,
    run_dir: os.PathLike | str,
    config: RunConfig | None = None,
    record: Mapping[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluates `policy` on `sets`, resuming whatever `run_dir` already holds.

    Args:
      sets: the sets, each fully evaluated in turn.
      policy: a `BatchedPolicy`, `FactoryPolicy` or `EndpointPolicy`.
      kinds: set kind by kind name (`hat_jax.eval.KINDS`).
      ctx: the released world and Harness, the loop's limits.
      run_dir: where items and the summary go.
      config: decoding, batching and concurrency.
      record: anything else the run should record (checkpoint, config file ...).
      progress: show a progress bar per set.

    Returns:
      The summary (also written to `run_dir/summary.json`).

    Raises:
      SetVersionError: a set was built for another live room than `ctx.room`, or `run_dir`
        holds results of another room or of another version of one of the sets.
      EvalError: the policy's endpoint does not answer, or every item of the first chunk of a
        set failed with a policy error.
    """
    config = config or RunConfig()
    run_dir = pathlib.Path(run_dir)
    previous = read_summary(run_dir) if (run_dir / SUMMARY_FILE).is_file() else {"sets": {}}
    judged = previous.get("run", {}).get("judge")
    if judged is not None and judged != ctx.describe_judge():
        raise SetVersionError(
            f"{run_dir} was scored by the judge {judged}, not {ctx.describe_judge()}: use a "
            "new run directory (runs compare only under the same Final Evaluation Judge)"
        )
    _check_rooms(sets, ctx, run_dir, previous)
    for s in sets:
        old = previous["sets"].get(s.name, {}).get("version")
        if old is not None and old != s.version:
            raise SetVersionError(
                f"{run_dir} holds results of {old}, not {s.version}: use a new run directory"
            )
    policy.check(config)
    summary = {
        "run": {
            "policy": policy.description,
            "room": ctx.room,
            "harness": ctx.harness.version,
            "judge": ctx.describe_judge(),
            "config": config.to_dict(),
            "limits": dataclasses.asdict(ctx.limits),
            "created": previous.get("run", {}).get(
                "created", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            ),
            **dict(record or {}),
        },
        "sets": dict(previous["sets"]),
    }
    for s in sets:
        kind = kinds[kind_name(s.name)]
        if getattr(policy, "agent_only", False) and not all(i.agent for i in s):
            reason = f"{policy.description.get('kind')} answers live-room requests only"
            summary.setdefault("skipped", {})[s.name] = reason
            print(f"eval: {s.name} skipped: {reason}", file=sys.stderr)
            continue
        records = _evaluate_set(s, kind, policy, ctx, run_dir, config, progress)
        summary["sets"][s.name] = {"version": s.version, **summarize(records, kind.metrics)}
        files.write_json(run_dir / SUMMARY_FILE, summary)
    files.write_json(run_dir / SUMMARY_FILE, summary)
    return summary


def _check_rooms(sets: Sequence[EvalSet], ctx: EvalContext, run_dir: pathlib.Path,
                 previous: Mapping[str, Any]) -> None:  # fmt: skip
    """Every set, and the run directory being resumed, belong to the context's live room."""
    for s in sets:
        check_room(s, ctx.room, "eval")
    before = previous.get("run", {}).get("room", DEFAULT_ROOM if previous.get("run") else None)
    if before is not None and before != ctx.room:
        raise SetVersionError(
            f"{run_dir} holds an evaluation in the {before!r} live room, not {ctx.room!r}: "
            "use a new run directory"
        )


def _evaluate_set(
    eval_set: EvalSet,
    kind: SetKind,
    policy: EvalPolicy,
    ctx: EvalContext,
    run_dir: pathlib.Path,
    config: RunConfig,
    progress: bool,
) -> list[dict[str, Any]]:
    from hat_jax.metrics import Progress

    path = run_dir / ITEMS_DIR / f"{eval_set.name}.jsonl"
    done = {r["id"]: r for r in read_items(run_dir, eval_set.name)}
    unknown = sorted(set(done) - {i.id for i in eval_set})
    if unknown:
        raise SetVersionError(f"{path} holds items not in {eval_set.version}: {unknown[:5]}")
    bar = Progress(len(eval_set), initial=len(done), desc=f"eval {eval_set.name}",
                   unit="item", enabled=progress)  # fmt: skip
    size = config.batch_size
    try:
        for c, first in enumerate(range(0, len(eval_set), size)):
            todo = [i for i in eval_set[first : first + size] if i.id not in done]
            if not todo:
                continue
            jobs = [(item, kind.prepare(item, ctx)) for item in todo]
            start = time.perf_counter()
            results = policy.run(jobs, ctx, config, stable_seed(config.seed, eval_set.name, c))
            seconds = (time.perf_counter() - start) / len(jobs)
            records = []
            for (item, prepared), result in zip(jobs, results, strict=True):
                scores = kind.score(item, prepared, result)
                rec = _record(item, scores, result, seconds, config.keep_trajectories)
                if hasattr(kind, "weights"):
                    rec["weights"] = dict(kind.weights(item))
                if "details" in prepared.extra:
                    rec["details"] = prepared.extra["details"]
                done[item.id] = rec
                records.append(rec)
            if c == 0 and all(r["policy_errors"] for r in records):
                raise EvalError(
                    f"{eval_set.name}: every item of the first chunk failed with a policy error "
                    f"(e.g. {_first_error(results)}); nothing written"
                )
            lines = (json.dumps(r, ensure_ascii=False, default=str) for r in records)
            files.write_jsonl(path, lines, append=True)
            bar.update(len(done))
    finally:
        bar.close()
    return [done[i.id] for i in eval_set]


def _first_error(results: Sequence[Any]) -> str:
    for r in results:
        if isinstance(r, hx.Trajectory):
            for f in r.faults:
                if f.kind == "policy_error":
                    return f.detail[:300]
    return "unknown"
