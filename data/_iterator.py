"""The iterator the trainer holds: a Grain iterator with a checked, JSON state and statistics.

It satisfies `hat_jax.train.DataSource`: `get_state()` (JSON, taken after the last batch
returned) is saved with each checkpoint, and `set_state()` on a fresh iterator of the same
pipeline continues with exactly the batches an uninterrupted run would have produced. A state
carries a fingerprint of the data config and is refused by a pipeline built differently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grain
import numpy as np

from data._accounting import COUNTERS, RowsIterator


class DataIterator:
    """A Grain dataset's iterator with state checks and running statistics.

    Args:
      dataset: the Grain dataset of batches (it holds a `RowsIterDataset` stage).
      fingerprint: identifies the data config a state belongs to.
      measure: batch -> counts to add to the running totals (tokens, padding, ...).
    """

    def __init__(
        self,
        dataset: grain.IterDataset,
        fingerprint: str,
        measure: Callable[[Mapping[str, np.ndarray]], Mapping[str, int]],
    ):
        self._fingerprint, self._measure = fingerprint, measure
        self._iter = dataset.__iter__()
        self._books = _find_rows_iterator(self._iter)
        self._totals: dict[str, int] = {"batches": 0}

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iter)
        self._totals["batches"] += 1
        for k, v in self._measure(batch).items():
            self._totals[k] = self._totals.get(k, 0) + int(v)
        return batch

    def get_state(self) -> dict[str, Any]:
        return {
            "fingerprint": self._fingerprint,
            "grain": self._iter.get_state(),
            "totals": dict(self._totals),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("fingerprint") != self._fingerprint:
            found = state.get("fingerprint") if isinstance(state, Mapping) else state
            raise ValueError(
                "data-iterator state was saved under a different data config "
                f"(fingerprint {found!r}, this pipeline {self._fingerprint!r})"
            )
        self._iter.set_state(state["grain"])
        self._totals = {k: int(v) for k, v in state["totals"].items()}

    def stats(self) -> dict[str, Any]:
        """Counts so far: records read / bad / empty, rows, truncated, too long, online HSA
        applied / refused and bad reasons (from the bookkeeping stage), plus batch totals."""
        books = self._books
        counters = books.counters if books is not None else {}
        out: dict[str, Any] = {k: int(counters.get(k, 0)) for k in COUNTERS}
        out.update(self._totals)
        if "slots" in out:
            out["padding_fraction"] = 1.0 - out.get("tokens", 0) / max(out["slots"], 1)
        out["skip_reasons"] = dict(books.reasons) if books is not None else {}
        return out

    def close(self) -> None:
        """Stops worker processes, if any."""
        close = getattr(self._iter, "close", None)
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
