"""The blind pairwise comparison (paper §5.6): two systems' replies to the same items, shown
side by side as "A" and "B" in a shuffled order without the systems' names.

A session lives in a folder:
- `session.json`, written once (atomically) when the session starts: the two run directories
  (system 1 and system 2), the seed, and the item order with which system is shown as A for
  each item. A reload, a restart or another browser sees the same order and sides; a folder
  started for other runs is refused by name.
- `labels.jsonl`, append-only, one line per decision, flushed and fsynced before the answer
  goes back, so a closed browser or a killed server loses nothing it acknowledged. The latest
  decision per item wins (a labeller may change their mind); a damaged line (a crash mid-write)
  is skipped and named.

The result counts system 1's wins and system 2's wins (ties apart) and tests the win rate over
non-ties against 1/2 with the exact two-sided binomial test.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import random
from typing import Any

from hat_jax import files
from serve.viewer._runs import Entry, Run

SESSION_FILE, LABELS_FILE = "session.json", "labels.jsonl"
CHOICES = ("A", "B", "tie")
REASONS = ("", "more accurate", "more helpful", "better tool use", "follows the rules",
           "better tone", "safer", "other")  # fmt: skip


def _label(rec: dict[str, Any]) -> dict[str, Any]:
    rec["set"], rec["item_id"]  # KeyError/TypeError name a damaged label
    return rec


class BlindError(ValueError):
    """The session cannot start (no shared items, a folder of another session)."""


def binomial_two_sided(successes: int, trials: int) -> float:
    """The exact two-sided binomial p-value of `successes` in `trials` under p = 1/2.

    With p = 1/2 the distribution is symmetric, so the outcomes at most as likely as the one
    observed are both tails beyond min(k, n - k): p = min(1, 2 * P(X <= min(k, n - k))),
    computed with integers (exact up to the final division).
    """
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    if trials == 0:
        return 1.0
    low = min(successes, trials - successes)
    tail = sum(math.comb(trials, i) for i in range(low + 1))
    return min(1.0, 2 * tail / 2**trials)


@dataclasses.dataclass(frozen=True)
class Pair:
    """Item `position` of the session: the same item in both runs, and which one is A."""

    position: int
    key: tuple[str, str]
    first: Entry  # system 1's entry
    second: Entry  # system 2's entry
    a_is: int  # 1 or 2: the system shown as A

    def shown(self, side: str) -> Entry:
        return self.first if (side == "A") == (self.a_is == 1) else self.second

    def winner(self, choice: str) -> int:
        """The system a choice of A, B or tie means (0 for a tie)."""
        if choice == "tie":
            return 0
        return self.a_is if choice == "A" else 3 - self.a_is


class BlindSession:
    """A labelling session over `first` and `second` in `folder` (see the module docstring)."""

    def __init__(self, first: Run, second: Run, folder: pathlib.Path | str, *, seed: int = 0):
        self.folder = pathlib.Path(folder)
        self.systems = (str(first.path.resolve()), str(second.path.resolve()))
        self.problems: list[str] = []
        plan = self._plan(first, second, seed)
        one = {e.key: e for e in reversed(first.entries)}  # the first entry of a key wins
        two = {e.key: e for e in reversed(second.entries)}
        self.pairs: list[Pair] = []
        for p in plan:
            key = tuple(p["key"])
            if key in one and key in two:
                self.pairs.append(Pair(len(self.pairs), key, one[key], two[key], p["a_is"]))
        missing = len(plan) - len(self.pairs)
        if missing:
            self.problems.append(f"{missing} items of the session are no longer in both runs")

    def _plan(self, first: Run, second: Run, seed: int) -> list[dict[str, Any]]:
        path = self.folder / SESSION_FILE
        if path.is_file():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                systems, seed, items = tuple(saved["systems"]), int(saved["seed"]), saved["items"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise BlindError(f"{path} is not a blind session ({err})") from None
            if systems != self.systems:
                raise BlindError(
                    f"{self.folder} is a session of {saved['systems'][0]} vs "
                    f"{saved['systems'][1]}, not of these runs: use another session folder"
                )
            self.seed = seed
            return items
        shared = [k for k in dict.fromkeys(e.key for e in first.entries)
                  if k in {e.key for e in second.entries}]  # fmt: skip
        if not shared:
            raise BlindError(
                f"{first.path} and {second.path} share no items (same set and item id)"
            )
        rng = random.Random(seed)
        rng.shuffle(shared)
        items = [{"key": list(k), "a_is": rng.choice((1, 2))} for k in shared]
        self.seed = seed
        files.write_json(path, {"format": 1, "systems": list(self.systems), "seed": seed,
                                "created": _now(), "items": items})  # fmt: skip
        return items

    def label(self, position: int, choice: str, reason: str = "") -> dict[str, Any]:
        """Records a decision durably (appended, flushed, fsynced) and returns its record."""
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {CHOICES}, got {choice!r}")
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {REASONS[1:]} or empty, got {reason!r}")
        pair = self.pairs[position]
        record = {"set": pair.key[0], "item_id": pair.key[1], "choice": choice,
                  "winner": pair.winner(choice), "reason": reason, "at": _now()}  # fmt: skip
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LABELS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return record

    def labels(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The latest decision per item (damaged lines named in `problems`)."""
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        path = self.folder / LABELS_FILE
        if not path.is_file():
            return latest
        problems: list[str] = []
        for rec in files.read_jsonl(path, _label, what="label", problems=problems):
            latest[(rec["set"], rec["item_id"])] = rec
        self.problems += [p for p in problems if p not in self.problems]
        return latest

    def result(self) -> dict[str, Any]:
        """Wins, ties, system 1's win rate over non-ties and the two-sided binomial p-value."""
        keys = {p.key for p in self.pairs}
        latest = [r for k, r in self.labels().items() if k in keys]
        winners = [r["winner"] for r in latest]
        reasons: dict[str, dict[str, int]] = {}
        for r in latest:
            if r.get("reason"):
                side = reasons.setdefault({0: "tie", 1: "system_1", 2: "system_2"}[r["winner"]], {})
                side[r["reason"]] = side.get(r["reason"], 0) + 1
        wins1, wins2, ties = winners.count(1), winners.count(2), winners.count(0)
        decided = wins1 + wins2
        return {
            "system_1": self.systems[0],
            "system_2": self.systems[1],
            "items": len(self.pairs),
            "labelled": len(winners),
            "wins_1": wins1,
            "wins_2": wins2,
            "ties": ties,
            "win_rate_1": wins1 / decided if decided else None,
            "p_value": binomial_two_sided(wins1, decided),
            "reasons": reasons,
            "test": "exact two-sided binomial test of system 1's wins over non-ties, p = 1/2",
        }

    def export(self) -> dict[str, Any]:
        """Every latest label (with the system it favours) and the result."""
        labels = self.labels()
        rows = [dict(labels[p.key], position=p.position, a_is=p.a_is)
                for p in self.pairs if p.key in labels]  # fmt: skip
        return {"format": 1, "session": str(self.folder), "seed": self.seed,
                "labels": rows, "result": self.result()}  # fmt: skip


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
