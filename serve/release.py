"""Release gates (paper §6): a candidate is released only when its evidence is of its own
checkpoint and it passes all three gates.

    decision = release(candidate, registry="runs/releases", gates=GateConfig())

A candidate binds a checkpoint, a Harness version and a serving config (the replay's run
manifest says where and how it was served), with the evidence: an evaluation run of the
checkpoint (`launch.eval`) and a deployment replay of its serving (`launch.replay`).

- **checkpoint** (the evidence's): the candidate's digest (`serve.digest.verify_digest`: its
  files hashed now; an export whose stored manifest no longer matches its files is refused)
  must equal the `checkpoint_digest` the evaluation run recorded (`run.policy`, written by
  `launch.eval`) and the one the replay recorded from its server (`manifest.json`); a run that
  records none (made before digests, or not with a checkpoint: the teacher, an endpoint that
  reports no checkpoint) is refused, and so is an evaluation and a replay whose recorded
  tokenizers differ. Both digests are named in the refusal.
- **latency**: the replay's SLO attainment (requests answered within `slo_s`, failures
  counted as misses) at its highest concurrency must reach `min_attainment`.
- **business**: on each business set (T1, T2) the candidate must not regress against the last
  passing release: the paired bootstrap of the per-item scores (`hat_jax.eval.compare_runs`,
  items paired by id, same set versions) must not put the whole interval of the difference
  below zero; its mean `metric` must reach `min_business` and its mean Effectiveness
  `min_effectiveness` (defaults that a policy whose every reply is the Hooks' fallback,
  Accuracy 1 / Effectiveness 0 / AVG 0.5, does not pass).
- **general capability**: the same on the general sets (the general instruction set, IFEval)
  that both runs evaluated.

The first candidate has no release to compare with: its business and general gates check
the floors only (and say so). A refused candidate is recorded with its failing figures and
the last passing release stays current. The registry holds `history.json` (every decision, in
order), `current.json` (the release in service) and `releases/<id>.json`, each written
atomically.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import uuid
from collections.abc import Sequence
from typing import Any

from hat_jax import files
from hat_jax.eval import compare_runs
from hat_jax.eval._stats import load_summary
from serve import digest

HISTORY, CURRENT, RELEASES = "history.json", "current.json", "releases"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateConfig:
    """The gates' thresholds.

    Attributes:
      min_attainment: the replay's attainment at its highest concurrency must reach this.
      business_sets, general_sets: set kinds of each gate (a run's "t1-dev" counts as "t1").
      metric: the per-item score compared ("avg", each set's headline figure).
      min_business: floor of the candidate's mean `metric` on every business set. The
        default 0.5 is the Hooks' fallback reply's T1/T2 AVG (Accuracy 1, Effectiveness 0):
        a policy below it does worse than always falling back.
      min_effectiveness: floor of the candidate's mean Effectiveness (the eval summary's
        `effectiveness`: the reply did what the viewer asked) on every business set; 0 turns
        the check off. The fallback scores 0, so a fallback-only policy, which meets the AVG
        floor exactly, is refused by this one.
      min_general: floor of the candidate's mean `metric` on every general set.
      confidence: the bootstrap interval's level; a regression is an interval wholly below 0.
      resamples, seed: the bootstrap's draws.
    """

    min_attainment: float = 0.95
    business_sets: tuple[str, ...] = ("t1", "t2")
    general_sets: tuple[str, ...] = ("general", "ifeval")
    metric: str = "avg"
    min_business: float = 0.5
    min_effectiveness: float = 0.1
    min_general: float = 0.0
    confidence: float = 0.95
    resamples: int = 10_000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What is proposed for release and the evidence for it.

    Attributes:
      checkpoint: the served checkpoint (HF export or Orbax).
      eval_run: the `launch.eval` run directory of that checkpoint.
      replay_run: the `launch.replay` run directory of its serving.
      serving: the serving config (e.g. the SGLang command's settings); the replay's
        endpoint, model and server info are added from its manifest.
      note: free text for the record.
    """

    checkpoint: str
    eval_run: str
    replay_run: str
    serving: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""


def _read_json(path: pathlib.Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: {path} does not exist") from None
    except ValueError as err:
        raise ValueError(f"{what}: {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}: {path} is not a JSON object")
    return data


def _latency_gate(replay_run: str, gates: GateConfig) -> dict[str, Any]:
    summary = _read_json(pathlib.Path(replay_run) / "summary.json", "the replay summary")
    levels = summary.get("levels") or {}
    if summary.get("aborted") or not levels:
        return {"passed": False, "why": f"the replay did not finish: {summary.get('aborted')}"}
    level = max(levels, key=int)
    figure = levels[level]
    passed = figure["attainment"] >= gates.min_attainment
    return {
        "passed": passed,
        "concurrency": int(level),
        "attainment": figure["attainment"],
        "slo_s": figure.get("slo_s"),
        "latency_p95_s": figure.get("latency_p95_s"),
        "why": "" if passed else (
            f"attainment {figure['attainment']:.3f} at concurrency {level} < "
            f"{gates.min_attainment}"
        ),
    }  # fmt: skip


def _kind(set_name: str) -> str:
    return set_name.split("-", 1)[0]


def _quality_gate(
    kinds: Sequence[str], floors: Sequence[tuple[str, float]], candidate: Candidate,
    last: dict[str, Any] | None, gates: GateConfig,
) -> dict[str, Any]:  # fmt: skip
    """The business or general gate over the sets of `kinds` the candidate evaluated;
    `floors`: (metric, floor) pairs its means must reach (the first is `gates.metric`)."""
    summary = load_summary(candidate.eval_run)
    sets = [s for s in summary["sets"] if _kind(s) in kinds]
    if not sets:
        return {"passed": False, "why": f"the evaluation has none of the sets {list(kinds)}"}
    figures: dict[str, Any] = {}
    failures = []
    for name in sets:
        metrics = summary["sets"][name]["metrics"]
        figures[name] = {"mean": metrics.get(gates.metric)}
        for metric, floor in floors:
            mean = metrics.get(metric)
            figures[name].setdefault("floors", {})[metric] = {"mean": mean, "floor": floor}
            if mean is None or mean < floor:
                failures.append(f"{name}: {metric} {mean} below the floor {floor}")
    if last is None:
        why = "; ".join(failures)
        return {"passed": not failures, "sets": figures, "why": why,
                "baseline": "none (first release: floors only)"}  # fmt: skip
    compared = compare_runs(last["candidate"]["eval_run"], candidate.eval_run,
                            resamples=gates.resamples, seed=gates.seed,
                            confidence=gates.confidence)  # fmt: skip
    for name in sets:
        result = compared.get(name, {}).get(gates.metric)
        if result is None:
            failures.append(f"{name}: the last release {last['id']} has no results to compare")
            continue
        figures[name].update(result.to_dict())
        if result.high < 0:
            failures.append(
                f"{name}: {gates.metric} {result.mean_b:.4f} vs {result.mean_a:.4f} of release "
                f"{last['id']} (difference {result.delta:+.4f}, {gates.confidence:.0%} "
                f"interval [{result.low:+.4f}, {result.high:+.4f}] below zero)"
            )
    return {"passed": not failures, "sets": figures, "why": "; ".join(failures),
            "baseline": last["id"]}  # fmt: skip


def _checkpoint_gate(
    candidate: Candidate, summary: dict[str, Any], replay_manifest: dict[str, Any]
) -> dict[str, Any]:
    """Whether the evaluation and the replay were made with the candidate's checkpoint."""
    policy = summary["run"].get("policy") or {}
    evaluated = policy.get("checkpoint_digest")
    replayed = replay_manifest.get("checkpoint_digest")
    figures = {"eval": evaluated, "replay": replayed,
               "replay_source": replay_manifest.get("digest_source")}  # fmt: skip
    try:
        figures["candidate"] = digest.verify_digest(candidate.checkpoint)
    except digest.DigestMismatchError as err:
        return {"passed": False, **figures, "candidate": None, "why": str(err)}
    failures = []
    if not evaluated:
        failures.append(
            f"the evaluation run {candidate.eval_run} records no checkpoint digest: it predates "
            f"checkpoint digests or was not made with a checkpoint (policy "
            f"{policy.get('kind')}); evaluate {candidate.checkpoint} with launch.eval"
        )
    elif evaluated != figures["candidate"]:
        failures.append(
            f"the evaluation run {candidate.eval_run} ran checkpoint {evaluated}, not the "
            f"candidate {candidate.checkpoint} ({figures['candidate']})"
        )
    if not replayed:
        failures.append(
            f"the replay run {candidate.replay_run} records no checkpoint digest: it predates "
            "checkpoint digests or its server reported none; replay a server of "
            f"{candidate.checkpoint} with launch.replay"
        )
    elif replayed != figures["candidate"]:
        failures.append(
            f"the replay run {candidate.replay_run} replayed checkpoint {replayed} (from the "
            f"server's {figures['replay_source']}), not the candidate {candidate.checkpoint} "
            f"({figures['candidate']})"
        )
    tokenizers = (policy.get("tokenizer_digest"), replay_manifest.get("tokenizer_digest"))
    if all(tokenizers) and tokenizers[0] != tokenizers[1]:
        failures.append(
            f"the evaluation ran tokenizer {tokenizers[0]} but the replay's server {tokenizers[1]}"
        )
    return {"passed": not failures, **figures, "why": "; ".join(failures)}


def current_release(registry: os.PathLike | str) -> dict[str, Any] | None:
    """The release in service (None before the first)."""
    path = pathlib.Path(registry) / CURRENT
    return _read_json(path, "the current release") if path.is_file() else None


def release(
    candidate: Candidate,
    *,
    registry: os.PathLike | str,
    gates: GateConfig = GateConfig(),  # noqa: B008
) -> dict[str, Any]:
    """Runs the gates (checkpoint, latency, business, general); a passing candidate becomes the
    current release.

    Returns:
      The decision record: `id`, `status` ("released" | "refused"), `gates` (figures and
      `why` per gate), the candidate and what it binds (checkpoint, Harness version, serving).

    Raises:
      FileNotFoundError / ValueError: the evidence is missing or malformed (named).
    """
    registry = pathlib.Path(registry)
    if not pathlib.Path(candidate.checkpoint).exists():
        raise FileNotFoundError(f"the candidate checkpoint {candidate.checkpoint} does not exist")
    last = current_release(registry)
    summary = load_summary(candidate.eval_run)
    replay_manifest = _read_json(pathlib.Path(candidate.replay_run) / "manifest.json",
                                 "the replay manifest")  # fmt: skip
    harness = summary["run"].get("harness")
    if replay_manifest.get("harness_version") not in (None, harness):
        raise ValueError(
            f"the evaluation ran Harness {harness} but the replay {replay_manifest['harness_version']}"
            ": the evidence must be of one Harness version"
        )
    business_floors = [(gates.metric, gates.min_business)]
    if gates.min_effectiveness > 0:
        business_floors.append(("effectiveness", gates.min_effectiveness))
    results = {
        "checkpoint": _checkpoint_gate(candidate, summary, replay_manifest),
        "latency": _latency_gate(candidate.replay_run, gates),
        "business": _quality_gate(gates.business_sets, business_floors, candidate, last, gates),
        "general": _quality_gate(
            gates.general_sets, [(gates.metric, gates.min_general)], candidate, last, gates
        ),  # fmt: skip
    }
    passed = all(g["passed"] for g in results.values())
    record = {
        "id": f"r{datetime.datetime.now(datetime.UTC):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}",
        "status": "released" if passed else "refused",
        "decided_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "binds": {
            "checkpoint": str(candidate.checkpoint),
            "checkpoint_digest": results["checkpoint"].get("candidate"),
            "harness_version": harness,
            "serving": {
                **candidate.serving,
                "endpoint": replay_manifest.get("endpoint"),
                "model": replay_manifest.get("model"),
                "server_info": replay_manifest.get("server_info"),
            },
        },  # fmt: skip
        "candidate": dataclasses.asdict(candidate),
        "replay": {
            "run_id": replay_manifest.get("run_id"),
            "cases": replay_manifest.get("cases"),
        },  # fmt: skip
        "gates": {**results, "config": dataclasses.asdict(gates)},
        "previous": last["id"] if last else None,
    }
    files.write_json(registry / RELEASES / f"{record['id']}.json", record)
    history_path = registry / HISTORY
    history = _read_json(history_path, "the release history") if history_path.is_file() else {}
    entries = list(history.get("decisions", []))
    entries.append({k: record[k] for k in ("id", "status", "decided_at", "previous")}
                   | {"failed": [n for n, g in results.items() if not g["passed"]]})  # fmt: skip
    files.write_json(history_path, {"decisions": entries})
    if passed:
        files.write_json(registry / CURRENT, record)
    return record
