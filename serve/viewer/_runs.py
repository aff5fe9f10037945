"""Runs on disk as one list of entries: evaluation, simulator and replay runs, read leniently.

Three layouts are recognised by their files:
- evaluation (`hat_jax.eval.evaluate`): `summary.json` and `items/<set>.jsonl`, one record per
  item (scores, reply, trajectory);
- simulator (`python -m launch.simulate`): `trajectories.jsonl` with `episodes.jsonl` beside it,
  line k of one belonging to line k of the other (scenario, seed, rewards);
- replay (`serve.replay`): `requests.jsonl` (one record per request: case, latency, success,
  score, and the episode's trajectory when the run kept it), `manifest.json`, `summary.json`.

A viewer must show what a damaged run still holds: a line that is not JSON, or a record missing
what its layout needs, is skipped and named (`Run.problems`, "file:line: why"); the other
entries are kept. Nothing here checks versions or scores anything.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

KINDS = ("eval", "sim", "replay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One trajectory (or result) of a run.

    Attributes:
      run: the index of its run in the viewer's list.
      index: its position in that run (the address `/item/<run>/<index>`).
      set: the evaluation set (eval), "sim" or the replay's case set.
      item_id: the item's id within the set (for a simulator episode: `scenario#seed`).
      family: the scenario family ("" when the run does not say).
      score: the one score filters use: `avg` when the run gives it, else the mean of the
        numeric scores, None when there is none.
      scores: every numeric score by name.
      reply: the final reply (public, else private, else "").
      trajectory: the `hat_jax.harness.Trajectory` as a dict, a single call's
        `{"reasoning", "content"}`, or None when the run did not keep it.
      extra: what the layout adds (seconds, latency, success, error, injected faults ...).
      source: "file:line" of the record.
    """

    run: int
    index: int
    set: str
    item_id: str
    family: str
    score: float | None
    scores: dict[str, float]
    reply: str
    trajectory: dict[str, Any] | None
    extra: dict[str, Any]
    source: str

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the item across runs: (set, item id)."""
        return self.set, self.item_id


@dataclasses.dataclass(kw_only=True)
class Run:
    """A run directory as read: its layout, entries, and every problem met on the way."""

    path: pathlib.Path
    kind: str
    entries: list[Entry]
    problems: list[str]
    info: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)


def read_run(path: pathlib.Path | str, run: int = 0) -> Run:
    """Reads one run directory; an unknown layout is a run with no entries and one problem."""
    path = pathlib.Path(path)
    problems: list[str] = []
    if (path / "items").is_dir():
        kind, entries, info = (
            "eval",
            _eval_entries(path, run, problems),
            _json(path / "summary.json", problems),
        )
    elif (path / "trajectories.jsonl").is_file():
        kind, entries, info = (
            "sim",
            _sim_entries(path, run, problems),
            _json(path / "summary.json", problems),
        )
    elif (path / "requests.jsonl").is_file():
        kind, entries, info = (
            "replay",
            _replay_entries(path, run, problems),
            _json(path / "manifest.json", problems),
        )
    else:
        what = "does not exist" if not path.exists() else "holds no run"
        problems.append(
            f"{path} {what} (expected items/ of an evaluation, trajectories.jsonl of a "
            "simulator run or requests.jsonl of a replay)"
        )
        kind, entries, info = "unknown", [], {}
    return Run(path=path, kind=kind, entries=entries, problems=problems, info=info)  # fmt: skip


def _json(path: pathlib.Path, problems: list[str]) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        problems.append(f"{path}: not readable JSON ({err})")
        return {}
    return data if isinstance(data, dict) else {}


def _lines(path: pathlib.Path, problems: list[str]) -> Iterator[tuple[int, int, dict | None]]:
    """(position among non-blank lines, line number, the object or None when it is bad)."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        position = 0
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError(f"a JSON {type(obj).__name__}, not an object")
            except ValueError as err:
                problems.append(f"{path}:{n}: not a JSON record ({err}); line skipped")
                obj = None
            yield position, n, obj
            position += 1


def _numbers(scores: Any) -> dict[str, float]:
    if not isinstance(scores, Mapping):
        return {}
    return {k: float(v) for k, v in scores.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip


def _primary(scores: Mapping[str, float]) -> float | None:
    if "avg" in scores:
        return scores["avg"]
    return sum(scores.values()) / len(scores) if scores else None


def _reply_of(trajectory: Any) -> str:
    final = trajectory.get("final") if isinstance(trajectory, Mapping) else None
    if isinstance(final, Mapping):
        return final.get("public") or final.get("private") or ""
    return ""


def _family_of(trajectory: Any) -> str:
    request = trajectory.get("request") if isinstance(trajectory, Mapping) else None
    rid = request.get("request_id") if isinstance(request, Mapping) else None
    return str(rid).split("/", 1)[0] if rid and "/" in str(rid) else ""


def _eval_entries(path: pathlib.Path, run: int, problems: list[str]) -> list[Entry]:
    entries: list[Entry] = []
    for file in sorted((path / "items").glob("*.jsonl")):
        for _, n, rec in _lines(file, problems):
            if rec is None:
                continue
            if not isinstance(rec.get("id"), str):
                problems.append(f"{file}:{n}: an evaluation record without an 'id'; line skipped")
                continue
            scores = _numbers(rec.get("scores"))
            trajectory = rec.get("trajectory") if isinstance(rec.get("trajectory"), dict) else None
            entries.append(Entry(
                run=run, index=len(entries), set=str(rec.get("set") or file.stem),
                item_id=rec["id"], family=str(rec.get("family") or ""), score=_primary(scores),
                scores=scores, reply=str(rec.get("output") or ""), trajectory=trajectory,
                extra={k: rec[k] for k in ("seconds", "policy_errors", "details") if k in rec},
                source=f"{file}:{n}",
            ))  # fmt: skip
    return entries


def _sim_entries(path: pathlib.Path, run: int, problems: list[str]) -> list[Entry]:
    episodes = {k: (n, rec) for k, n, rec in _lines(path / "episodes.jsonl", problems)}
    entries: list[Entry] = []
    file = path / "trajectories.jsonl"
    for k, n, trajectory in _lines(file, problems):
        if trajectory is None:
            continue
        _, episode = episodes.get(k, (None, None))
        episode = episode or {}
        scores = _numbers(episode.get("rewards"))
        scenario = str(
            episode.get("scenario") or (trajectory.get("request") or {}).get("request_id") or k
        )
        entries.append(Entry(
            run=run, index=len(entries), set="sim", item_id=f"{scenario}#{episode.get('seed', k)}",
            family=scenario.split("/", 1)[0] if "/" in scenario else _family_of(trajectory),
            score=_primary(scores), scores=scores, reply=_reply_of(trajectory),
            trajectory=trajectory,
            extra={k: episode[k] for k in ("seed", "augmented", "faults", "harness") if k in episode},
            source=f"{file}:{n}",
        ))  # fmt: skip
    return entries


def _replay_entries(path: pathlib.Path, run: int, problems: list[str]) -> list[Entry]:
    manifest = _json(path / "manifest.json", [])
    case_set = str((manifest.get("cases") or {}).get("set") or "replay")
    entries: list[Entry] = []
    file = path / "requests.jsonl"
    for _, n, rec in _lines(file, problems):
        if rec is None:
            continue
        if "case" not in rec:
            problems.append(f"{file}:{n}: a replay record without a 'case'; line skipped")
            continue
        trajectory = rec.get("trajectory") if isinstance(rec.get("trajectory"), dict) else None
        score = rec.get("score")
        scores = {"score": float(score)} if isinstance(score, int | float) else {}
        keys = ("concurrency", "index", "warmup", "latency_s", "ttft_s", "completion_tokens",
                "decode_tokens_per_s", "model_calls", "success", "error")  # fmt: skip
        entries.append(Entry(
            run=run, index=len(entries), set=case_set, item_id=str(rec["case"]),
            family=_family_of(trajectory), score=scores.get("score"), scores=scores,
            reply=_reply_of(trajectory), trajectory=trajectory,
            extra={k: rec[k] for k in keys if k in rec}, source=f"{file}:{n}",
        ))  # fmt: skip
    return entries
