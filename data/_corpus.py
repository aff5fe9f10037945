# Over 400 lines: corpus generation, its filters and its statistics share one outcome record.
"""The HSA-SFT teacher corpus: scenarios x Harness states x a teacher, filtered, written.

For every scenario of a split, K Harness states (the original and K-1 fresh augmentations, or
the original only for the Fixed-Harness ablation) and one teacher episode in each, run by the
simulator (`rl.sim.LiveRoom`: sandboxed tools, optional fault injection, the Harness's agent
loop) and scored by its rule rewards. A trajectory is kept when Accuracy is 1 and
Effectiveness reaches the threshold, and it ends with the teacher's own reply. Kept
trajectories go through the retry-history policy: those with a Hook-triggered retry keep their
complete history with probability `retry_fraction`, else only the final valid behaviour. The
scripted teacher makes a deliberate mistake (which a Hook catches) in `inject_fraction` of
episodes, so the corpus holds recoveries to keep or clean.

Every draw derives from (seed, scenario id, state index), so a corpus is reproducible and the
same whatever the number of worker processes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import os
import pathlib
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from data._convert import ConversionError, has_retries, malformed_turns
from data._records import SCHEMA, CorpusWriter, corpus_record, state_info, write_json
from hat_jax import harness as hx
from hat_jax import livestream
from hat_jax.files import write_text

SAMPLES = ("uniform", "families")
STATE_MODES = ("original+augmented", "original", "augmented")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherConfig:
    """Which teacher writes the trajectories.

    Attributes:
      kind: "scripted" (the simulator's gold teacher) or "openai" (any OpenAI-compatible
        chat-completions endpoint).
      base_url, model, api_key: the endpoint (kind "openai").
      server_extensions: send SGLang's `chat_template_kwargs` and `separate_reasoning` fields
        (kind "openai"; off for hosted APIs that reject them).
      temperature, max_tokens: its sampling.
      inject_fraction: share of scripted episodes with one deliberate, Hook-caught mistake.
    """

    kind: str = "scripted"
    base_url: str = ""
    model: str = ""
    api_key: str | None = None
    server_extensions: bool = False
    temperature: float = 0.7
    max_tokens: int = 2048
    inject_fraction: float = 0.15

    def __post_init__(self):
        if self.kind not in ("scripted", "openai"):
            raise ValueError(f"teacher kind must be 'scripted' or 'openai', got {self.kind!r}")
        if self.kind == "openai" and not (self.base_url and self.model):
            raise ValueError("an OpenAI-compatible teacher needs base_url and model")
        if not 0.0 <= self.inject_fraction <= 1.0:
            raise ValueError(f"inject_fraction must be in [0, 1], got {self.inject_fraction}")

    def describe(self) -> dict[str, Any]:
        if self.kind == "scripted":
            return {"kind": "scripted"}
        return {"kind": "openai", "model": self.model, "base_url": self.base_url}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """What `generate` produces.

    Attributes:
      room: the bundled live room (`livestream.room`: "v0" or "micro"): its scenarios, its
        released Harness (the original state and what HSA varies) and its world.
      split: the scenario split (train, dev, test).
      num_scenarios: how many scenarios of the split (a seeded sample; None = all).
      sample: how `num_scenarios` are drawn: "uniform" over the split's scenarios (families
        in the pool's proportions), or "families": dealt round-robin over the families, as
        the evaluation sets draw theirs (`hat_jax.eval` T1/T2), so a family the pool holds
        few scenarios of is trained on as often as the others.
      states_per_scenario: K, Harness states (episodes) per scenario.
      states: "original+augmented" (state 0 original, the rest augmented), "original" (the
        Fixed-Harness ablation: every state is the original) or "augmented".
      hsa_dims, hsa_strength: the augmentation (see `hat_jax.hsa.augment`).
      dims_per_state: vary this many of `hsa_dims` per augmented state, drawn at random (None:
        all of them), so statistics can tell the dimensions apart.
      fault_rate: probability that a tool call fails (split evenly between timeout, malformed
        and denied); the teacher's recoveries from them are kept.
      min_effectiveness: the quality filter's Effectiveness threshold (Accuracy must be 1).
      retry_fraction: share of retried trajectories keeping their complete retry history.
      teacher: the teacher.
      seed: every draw derives from it.
    """

    room: str = "v0"
    split: str = "train"
    num_scenarios: int | None = None
    sample: str = "uniform"
    states_per_scenario: int = 4
    states: str = "original+augmented"
    hsa_dims: str = "all"
    hsa_strength: float = 0.5
    dims_per_state: int | None = None
    fault_rate: float = 0.05
    min_effectiveness: float = 1.0
    retry_fraction: float = 0.1
    teacher: TeacherConfig = TeacherConfig()
    seed: int = 0

    def __post_init__(self):
        livestream.room(self.room)  # an unknown room is refused here, by name
        if self.sample not in SAMPLES:
            raise ValueError(f"sample must be one of {SAMPLES}, got {self.sample!r}")
        if self.states not in STATE_MODES:
            raise ValueError(f"states must be one of {STATE_MODES}, got {self.states!r}")
        if self.dims_per_state is not None and self.dims_per_state < 1:
            raise ValueError(f"dims_per_state must be >= 1 or None, got {self.dims_per_state}")
        if self.states_per_scenario < 1:
            raise ValueError(f"states_per_scenario must be >= 1, got {self.states_per_scenario}")
        for name in ("hsa_strength", "fault_rate", "min_effectiveness", "retry_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


@dataclasses.dataclass
class Outcome:
    """One episode's fate: its record (if kept) and what the statistics need."""

    record: dict[str, Any] | None
    family: str
    dims: tuple[str, ...]
    augmented: bool
    rewards: dict[str, float]
    reason: str  # "kept" or why it was filtered
    retry_history: str = "none"
    # The teacher endpoint's calls, retries and failures in this episode ({}: no endpoint).
    teacher_calls: dict[str, int] = dataclasses.field(default_factory=dict)


class _Episodes:
    """Runs the episodes of one scenario (one instance per worker process)."""

    def __init__(self, config: CorpusConfig):
        from hat_jax import hsa
        from rl import sim

        self.config, self.sim, self.hsa = config, sim, hsa
        rate = config.fault_rate / 3
        faults = sim.FaultConfig(timeout=rate, malformed=rate, denied=rate)
        self.room = sim.LiveRoom(sim.SimConfig(room=config.room, split=config.split, faults=faults))
        self.dims = hsa.parse_dims(config.hsa_dims)
        self._policy = None

    def policy(self, inject: str | None):
        t = self.config.teacher
        if t.kind == "scripted":
            return self.room.teacher(inject=inject)
        if self._policy is None:
            self._policy = hx.OpenAICompatPolicy(
                base_url=t.base_url,
                model=t.model,
                api_key=t.api_key,
                server_extensions=t.server_extensions,
            )
        return self._policy

    def state(
        self, scenario, k: int, inject: str | None
    ) -> tuple[hx.HarnessState, tuple[str, ...]]:
        """Episode k's Harness state and the dimensions it varies (() for the original)."""
        c = self.config
        original = c.states == "original" or (c.states == "original+augmented" and k == 0)
        if original or not self.dims or c.hsa_strength == 0:
            return hx.HarnessState(harness=self.room.harness), ()
        dims = sorted(str(d) for d in self.dims)
        if c.dims_per_state is not None and c.dims_per_state < len(dims):
            dims = sorted(
                random.Random(_seed(c.seed, "dims", scenario.id, k)).sample(dims, c.dims_per_state)
            )
        needs = self.sim.injection_needs(scenario, inject)
        if c.fault_rate > 0:  # room for one retry round after a fault, within the valid range
            limit = next(
                x.max for x in self.room.harness.prompt.constraints if x.name == "max_rounds"
            )
            needs = needs.merged(self.hsa.Preserve(min_rounds=min(limit, needs.min_rounds + 1)))
        seed = _seed(c.seed, "augment", scenario.id, k)
        state = self.hsa.augment(
            self.room.harness, seed=seed, dims=dims, strength=c.hsa_strength, preserve=needs
        )
        return state, tuple(dims)

    def __call__(self, scenario_id: str) -> list[Outcome]:
        scenario = self.room.scenarios.get(scenario_id)
        return [self.one(scenario, k) for k in range(self.config.states_per_scenario)]

    def one(self, scenario, k: int) -> Outcome:
        c = self.config
        rng = random.Random(_seed(c.seed, "episode", scenario.id, k))
        inject = None
        if c.teacher.kind == "scripted" and rng.random() < c.teacher.inject_fraction:
            inject = rng.choice(self.sim.INJECTIONS)
        try:
            policy = self.policy(inject)
            if inject is not None:
                policy(scenario, hx.HarnessState(harness=self.room.harness))  # applicable?
        except ValueError:
            inject, policy = None, self.policy(None)
        state, dims = self.state(scenario, k, inject)
        sampling = hx.SamplingParams(
            temperature=c.teacher.temperature,
            max_tokens=c.teacher.max_tokens,
            seed=_seed(c.seed, "sampling", scenario.id, k) % 2**31,
        )
        before = _call_counts(policy)
        ep = self.room.run(
            policy, scenario, seed=_seed(c.seed, scenario.id, k), state=state, sampling=sampling
        )
        out = self.judge(ep, scenario, k, state, dims, inject, rng)
        after = _call_counts(policy)
        out.teacher_calls = {name: after[name] - before.get(name, 0) for name in after}
        return out

    def judge(self, ep, scenario, k, state, dims, inject, rng) -> Outcome:
        c, r = self.config, ep.rewards
        rewards = {d: float(v) for d, v in r.to_dict().items() if d != "details"}
        augmented = bool(dims)
        out = Outcome(None, scenario.family, dims, augmented, rewards, "kept")
        if ep.trajectory.final.fallback or ep.trajectory.final.end not in ("reply", "no_reply"):
            out.reason = "no_valid_reply"
        elif r.accuracy < 1.0:
            out.reason = "accuracy"
        elif r.effectiveness < c.min_effectiveness:
            out.reason = "effectiveness"
        if out.reason != "kept":
            return out
        traj = ep.trajectory
        retried = has_retries(traj.messages, malformed_turns(traj))
        keep_full = retried and rng.random() < c.retry_fraction
        info = state_info(
            state,
            kind="augmented" if augmented else "original",
            seed=_seed(c.seed, "augment", scenario.id, k) if augmented else None,
            dims=dims,
            strength=c.hsa_strength if augmented else 0.0,
            base_version=self.room.harness.version,
        )
        try:
            out.record = corpus_record(
                traj,
                record_id=f"{scenario.id}/s{k}",
                tools=[dict(t) for t in hx.tool_schemas(state)],
                state=info,
                keep_retries=keep_full,
                scenario={
                    "id": scenario.id,
                    "family": scenario.family,
                    "split": scenario.split,
                    "phrasing": scenario.phrasing,
                    "inject": inject,
                },
                teacher=c.teacher.describe(),
                rewards=r.to_dict(),
            )
        except ConversionError:
            out.reason = "unconvertible"
            return out
        out.retry_history = out.record["retry_history"]
        return out


def _call_counts(policy) -> dict[str, int]:
    """The teacher endpoint's call counts so far ({} for a teacher without an endpoint)."""
    stats = getattr(policy, "stats", None)
    return stats.to_dict() if stats is not None else {}


_WORKER: _Episodes | None = None


def _init_worker(config: CorpusConfig) -> None:
    global _WORKER
    _WORKER = _Episodes(config)


def _run_in_worker(scenario_id: str) -> list[Outcome]:
    assert _WORKER is not None
    return _WORKER(scenario_id)


def scenario_ids(config: CorpusConfig) -> list[str]:
    """The scenarios of the corpus: a seeded sample of the split (`config.sample`), in a
    stable order."""
    from rl import sim

    pool = sim.default_scenarios(config.room).split(config.split)
    ids = [s.id for s in pool]
    if not ids:
        raise ValueError(f"no scenarios in split {config.split!r}")
    n = config.num_scenarios
    if n is None or n >= len(ids):
        return ids
    rng = random.Random(_seed(config.seed, "sample"))
    if config.sample == "uniform":
        return sorted(rng.sample(ids, n))
    by_family: dict[str, list[str]] = {}
    for s in pool:
        by_family.setdefault(s.family, []).append(s.id)
    decks = [rng.sample(v, len(v)) for _, v in sorted(by_family.items())]
    dealt = [deck[i] for i in range(max(map(len, decks))) for deck in decks if i < len(deck)]
    return sorted(dealt[:n])


def generate(
    config: CorpusConfig, *, workers: int = 1, progress: Callable[[int], None] | None = None
) -> Iterator[Outcome]:
    """Runs every episode of the corpus; yields outcomes in scenario order.

    Args:
      config: the corpus.
      workers: processes running episodes (results are the same for any number).
      progress: called with the number of scenarios done so far.
    """
    ids = scenario_ids(config)
    if workers <= 1:
        episodes = _Episodes(config)
        results: Iterable[list[Outcome]] = map(episodes, ids)
        pool = None
    else:
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, initializer=_init_worker, initargs=(config,)
        )
        results = pool.map(_run_in_worker, ids, chunksize=4)
    try:
        for n, outcomes in enumerate(results, 1):
            yield from outcomes
            if progress is not None:
                progress(n)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


class CorpusStats:
    """Counts kept and filtered episodes per family, per HSA dimension and per reason, mean
    rewards per reward dimension (over all episodes and over kept ones), and the teacher
    endpoint's calls, retries and failed calls (an OpenAI-compatible teacher: a turn that failed
    after its retries ends the episode without a valid reply)."""

    def __init__(self):
        self.total = collections.Counter()
        self.family: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.dimension: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter
        )
        self.reward_sums: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter
        )
        self.teacher = collections.Counter()

    def add(self, o: Outcome) -> None:
        kept = o.reason == "kept"
        self.teacher.update(o.teacher_calls)
        for counter in (self.total, self.family[o.family]):
            counter["episodes"] += 1
            counter["kept" if kept else "filtered"] += 1
            if not kept:
                counter[f"filtered:{o.reason}"] += 1
        for dim in o.dims or ("original",):
            self.dimension[dim]["episodes"] += 1
            self.dimension[dim]["kept" if kept else "filtered"] += 1
        if kept:
            self.total[f"retry_history:{o.retry_history}"] += 1
        for group in ("all", "kept") if kept else ("all",):
            self.reward_sums[group]["n"] += 1
            for name, value in o.rewards.items():
                self.reward_sums[group][name] += value

    def to_dict(self) -> dict[str, Any]:
        def means(c: Mapping[str, float]) -> dict[str, float]:
            n = max(c.get("n", 0), 1)
            return {k: round(v / n, 4) for k, v in c.items() if k != "n"}

        return {
            "total": dict(self.total),
            "per_family": {f: dict(c) for f, c in sorted(self.family.items())},
            "per_dimension": {d: dict(c) for d, c in sorted(self.dimension.items())},
            "mean_rewards": {g: means(c) for g, c in self.reward_sums.items()},
            "teacher_calls": dict(self.teacher),
        }

    def markdown(self, title: str) -> str:
        d = self.to_dict()
        reasons = {k: v for k, v in d["total"].items() if k.startswith(("filtered:", "retry_"))}
        rewards = d["mean_rewards"]
        names = list(rewards.get("all", {}))
        lines = [f"# {title}", "", *_table({"all": d["total"]})]
        lines += ["", "## Per family", "", *_table(d["per_family"])]
        lines += [
            "",
            "## Per HSA dimension",
            "",
            "An episode counts once per dimension varied.",
            "",
        ]
        lines += _table(d["per_dimension"])
        lines += ["", "## Filter reasons and retry histories", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(reasons.items())] or ["- none"]
        if d["teacher_calls"]:
            lines += ["", "## Teacher endpoint", ""]
            lines += [f"- {k}: {v}" for k, v in d["teacher_calls"].items()]
        lines += ["", "## Mean rewards", "", "| | " + " | ".join(names) + " |"]
        lines.append("|---|" + "---:|" * len(names))
        for group, m in rewards.items():
            lines.append(f"| {group} | " + " | ".join(f"{m[n]:.3f}" for n in names) + " |")
        return "\n".join(lines) + "\n"


def _table(rows: Mapping[str, Mapping[str, int]]) -> list[str]:
    out = ["| | episodes | kept | filtered |", "|---|---:|---:|---:|"]
    for name, c in rows.items():
        out.append(
            f"| {name} | {c.get('episodes', 0)} | {c.get('kept', 0)} | {c.get('filtered', 0)} |"
        )
    return out


def write_corpus(
    config: CorpusConfig,
    out_dir: os.PathLike | str,
    *,
    num_shards: int = 4,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Generates the corpus of one split into `out_dir` and returns its manifest.

    Writes `<split>-NNNNN-of-MMMMM.array_record` shards and `<split>.jsonl` (atomically, on
    success only), `<split>.stats.json` and `<split>.stats.md`, and `<split>.manifest.json`
    (config, Harness version, counts, files).
    """
    from hat_jax import hsa

    out_dir = pathlib.Path(out_dir)
    stats = CorpusStats()
    started = time.perf_counter()
    with CorpusWriter(out_dir, config.split, num_shards=num_shards) as writer:
        for outcome in generate(config, workers=workers, progress=progress):
            stats.add(outcome)
            if outcome.record is not None:
                writer.write(outcome.record)
        if writer.count == 0:  # raised inside: the writer leaves no files behind
            raise ValueError(f"no trajectory passed the quality filter: {stats.to_dict()['total']}")
    base = hx.load(livestream.room(config.room).harness_dir)
    manifest = {
        "schema": SCHEMA,
        "split": config.split,
        "records": writer.count,
        "files": [p.name for p in writer.files],
        "config": dataclasses.asdict(config) | {"teacher": config.teacher.describe()},
        "room": config.room,
        "harness": {"name": base.name, "release": base.release, "version": base.version},
        "hsa_dims": sorted(str(d) for d in hsa.parse_dims(config.hsa_dims)),
        "seconds": round(time.perf_counter() - started, 1),
        "stats": stats.to_dict(),
    }
    write_json(out_dir / f"{config.split}.stats.json", stats.to_dict())
    write_text(
        out_dir / f"{config.split}.stats.md",
        stats.markdown(f"Corpus {config.split}: {writer.count} records"),
    )
    write_json(out_dir / f"{config.split}.manifest.json", manifest)
    return manifest
