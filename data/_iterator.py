"""The iterator the trainer holds: Grain iterators of the data shards, with a checked JSON
state and statistics.

It satisfies `hat_jax.train.DataSource`: `get_state()` (JSON, taken after the last batch
returned) is saved with each checkpoint, and `set_state()` on a fresh iterator of the same
pipeline continues with exactly the batches an uninterrupted run would have produced. A state
carries a fingerprint of the data config and is refused by a pipeline built differently.

A batch is the rows of this process's data shards (`data._shards`), shard after shard. The
state holds one position per shard, so the states that every process of a run saved can be
given together (`set_state([state, ...])`) to a process of a run with another process count:
it takes the positions of the shards it now reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from data._accounting import COUNTERS, RowsIterator


class DataIterator:
    """Grain iterators of one process's data shards, with state checks and statistics.

    Args:
      shards: the Grain dataset of each data shard this process reads, by shard index (each
        holds a `RowsIterDataset` stage); their batches are concatenated in index order.
      fingerprint: identifies the data config a state belongs to (not the process count).
      measure: batch -> counts to add to the running totals (tokens, padding, ...).
    """

    # `set_state` also takes the states of every process of a run with another process count
    # (the trainer gives them so when it resumes such a checkpoint).
    resplits_states = True

    def __init__(
        self,
        shards: Mapping[int, grain.IterDataset],
        fingerprint: str,
        measure: Callable[[Mapping[str, np.ndarray]], Mapping[str, int]],
    ):
        if not shards:
            raise ValueError("DataIterator: no data shards")
        self._fingerprint, self._measure = fingerprint, measure
        self._iters = {int(s): shards[s].__iter__() for s in sorted(shards)}
        self._books = {s: _find_rows_iterator(it) for s, it in self._iters.items()}
        self._totals: dict[int, dict[str, int]] = {s: {"batches": 0} for s in self._iters}

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        parts = []
        for shard, it in self._iters.items():
            batch = next(it)
            totals = self._totals[shard]
            totals["batches"] += 1
            for k, v in self._measure(batch).items():
                totals[k] = totals.get(k, 0) + int(v)
            parts.append(batch)
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def get_state(self) -> dict[str, Any]:
        return {
            "fingerprint": self._fingerprint,
            "shards": {
                str(s): {"grain": it.get_state(), "totals": dict(self._totals[s])}
                for s, it in self._iters.items()
            },
        }

    def set_state(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continues from `state` (this iterator's own kind), or from the states every process
        of a run saved (a list): the positions of this iterator's shards are taken from them.

        Raises:
          ValueError: a state of another data config, or states that lack one of this
            iterator's shards.
        """
        states = [state] if isinstance(state, Mapping) else list(state)
        positions: dict[int, Mapping[str, Any]] = {}
        for s in states:
            if not isinstance(s, Mapping) or s.get("fingerprint") != self._fingerprint:
                found = s.get("fingerprint") if isinstance(s, Mapping) else s
                raise ValueError(
                    "data-iterator state was saved under a different data config "
                    f"(fingerprint {found!r}, this pipeline {self._fingerprint!r})"
                )
            positions |= {int(k): v for k, v in s["shards"].items()}
        missing = sorted(set(self._iters) - set(positions))
        if missing:
            raise ValueError(
                f"the saved data state holds shards {sorted(positions)} but this process reads "
                f"{list(self._iters)}: shards {missing} are missing (give the states of every "
                "process of the saved run)"
            )
        for shard, it in self._iters.items():
            it.set_state(positions[shard]["grain"])
            self._totals[shard] = {k: int(v) for k, v in positions[shard]["totals"].items()}

    def stats(self) -> dict[str, Any]:
        """Counts so far over this process's shards: records read / bad / empty, rows,
        truncated, too long, online HSA applied / refused and bad reasons (from the
        bookkeeping stage), plus batch totals (`batches` counts this iterator's batches)."""
        out: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
        reasons: dict[str, int] = {}
        for books in self._books.values():
            if books is None:
                continue
            for k in COUNTERS:
                out[k] += int(books.counters.get(k, 0))
            for k, v in books.reasons.items():
                reasons[k] = reasons.get(k, 0) + int(v)
        for totals in self._totals.values():
            for k, v in totals.items():
                if k == "batches":
                    continue
                out[k] = out.get(k, 0) + v
        out["batches"] = min(t["batches"] for t in self._totals.values())
        if "slots" in out:
            out["padding_fraction"] = 1.0 - out.get("tokens", 0) / max(out["slots"], 1)
        out["skip_reasons"] = reasons
        return out

    def close(self) -> None:
        """Stops worker processes, if any."""
        for it in self._iters.values():
            close = getattr(it, "close", None)
            if close is not None:
                close()


def _find_rows_iterator(it: Any) -> RowsIterator | None:
    """The bookkeeping stage inside a Grain iterator chain (its counters feed `stats`)."""
    seen: set[int] = set()
    stack = [it]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, RowsIterator):
            return node
        stack += [p for p in getattr(node, "_parents", ()) if p is not None]
    return None
