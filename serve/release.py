"""Release gates (paper §6): a candidate is released only when it passes all three.

    decision = release(candidate, registry="runs/releases", gates=GateConfig())

A candidate binds a checkpoint, a Harness version and a serving config (the replay's run
manifest says where and how it was served), with the evidence: an evaluation run of the
checkpoint (`launch.eval`) and a deployment replay of its serving (`launch.replay`).

- **latency**: the replay's SLO attainment (requests answered within `slo_s`, failures
  counted as misses) at its highest concurrency must reach `min_attainment`.
- **business**: on each business set (T1, T2) the candidate must not regress against the last
  passing release: the paired bootstrap of the per-item scores (`hat_jax.eval.compare_runs`,
  items paired by id, same set versions) must not put the whole interval of the difference
  below zero; and its mean must reach `min_business`.
- **general capability**: the same on the general sets (the general instruction set, IFEval)
  that both runs evaluated.

The first candidate has no release to compare with: its business and general gates check
the minimums only (and say so). A refused candidate is recorded with its failing figures and
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

HISTORY, CURRENT, RELEASES = "history.json", "current.json", "releases"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateConfig:
    """The gates' thresholds.

    Attributes:
      min_attainment: the replay's attainment at its highest concurrency must reach this.
      business_sets, general_sets: set kinds of each gate (a run's "t1-dev" counts as "t1").
      metric: the per-item score compared ("avg", each set's headline figure).
      min_business, min_general: floors of the candidate's mean on every set of the gate.
      confidence: the bootstrap interval's level; a regression is an interval wholly below 0.
      resamples, seed: the bootstrap's draws.
    """

    min_attainment: float = 0.95
    business_sets: tuple[str, ...] = ("t1", "t2")
    general_sets: tuple[str, ...] = ("general", "ifeval")
    metric: str = "avg"
    min_business: float = 0.0
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
    kinds: Sequence[str], floor: float, candidate: Candidate, last: dict[str, Any] | None,
    gates: GateConfig,
) -> dict[str, Any]:  # fmt: skip
    """The business or general gate over the sets of `kinds` the candidate evaluated."""
    summary = load_summary(candidate.eval_run)
    sets = [s for s in summary["sets"] if _kind(s) in kinds]
    if not sets:
        return {"passed": False, "why": f"the evaluation has none of the sets {list(kinds)}"}
    figures: dict[str, Any] = {}
    failures = []
    for name in sets:
        mean = summary["sets"][name]["metrics"].get(gates.metric)
        figures[name] = {"mean": mean}
        if mean is None or mean < floor:
            failures.append(f"{name}: {gates.metric} {mean} below the floor {floor}")
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
    """Runs the three gates; a passing candidate becomes the current release.

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
    results = {
        "latency": _latency_gate(candidate.replay_run, gates),
        "business": _quality_gate(gates.business_sets, gates.min_business, candidate, last, gates),
        "general": _quality_gate(gates.general_sets, gates.min_general, candidate, last, gates),
    }
    passed = all(g["passed"] for g in results.values())
    record = {
        "id": f"r{datetime.datetime.now(datetime.UTC):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}",
        "status": "released" if passed else "refused",
        "decided_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "binds": {
            "checkpoint": str(candidate.checkpoint),
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
