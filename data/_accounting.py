"""The pipeline stage that turns prepared records into rows and keeps the books.

It runs in the main process, after any worker processes, so its counters see every record
exactly once and are part of the iterator state: a restored iterator continues the counts an
uninterrupted run would have. Bad records are skipped and their ids logged (the first
`LOG_LIMIT` of each kind individually); if a whole pass over the source yields nothing, the
stage stops with an error instead of spinning forever.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import grain

from data._examples import Prepared

_log = logging.getLogger(__name__)

LOG_LIMIT = 100

COUNTERS = (
    "records",  # records read
    "bad",  # unreadable or unrenderable records, skipped
    "empty",  # records whose every row was dropped
    "rows",  # rows emitted to packing
    "truncated",  # rows cut to seq_len
    "too_long",  # rows dropped for length
    "untrainable",  # rows dropped with no trained token
    "hsa_applied",  # records re-rendered under a fresh augmentation
    "hsa_refused",  # augmentations that could not express the record (rendered as stored)
    "bare",  # records rendered without their system prompt and tool schemas
)


class RowsIterDataset(grain.IterDataset):
    """Flattens `(location, Prepared)` elements into rows, counting and logging as it goes.

    Args:
      parent: yields `(location, Prepared)`.
      max_barren: raise after this many consecutive records without a row (e.g. one epoch of
        the source: every record is bad or too long for the row).
    """

    def __init__(self, parent: grain.IterDataset, *, max_barren: int):
        super().__init__(parent)
        self._max_barren = max(1, max_barren)

    def __iter__(self) -> RowsIterator:
        return RowsIterator(self._parent.__iter__(), max_barren=self._max_barren)

    def __str__(self) -> str:
        return "RowsIterDataset"


class RowsIterator(grain.DatasetIterator):
    """See `RowsIterDataset`. State: the parent's state before the current record, how many of
    its rows were emitted, and the counters before it."""

    def __init__(self, parent: grain.DatasetIterator, *, max_barren: int):
        super().__init__(parent)
        self._max_barren = max_barren
        self.counters: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()
        self._before: dict[str, Any] = self._snapshot()
        self._rows: list = []
        self._next_row = 0
        self._skip = 0
        self._barren = 0

    def _snapshot(self) -> dict[str, Any]:
        return {
            "parent": self._parent.get_state(),
            "counters": dict(self.counters),
            "reasons": dict(self.reasons),
            "barren": getattr(self, "_barren", 0),
        }

    def __next__(self) -> dict:
        while self._next_row >= len(self._rows):
            self._before = self._snapshot()
            location, prepared = next(self._parent)
            self._account(location, prepared)
            self._rows, self._next_row = prepared.rows, min(self._skip, len(prepared.rows))
            self._skip = 0
        row = self._rows[self._next_row]
        self._next_row += 1
        return row

    def _account(self, location: str, p: Prepared) -> None:
        c = self.counters
        c["records"] += 1
        c["truncated"] += p.truncated
        c["too_long"] += p.too_long
        c["untrainable"] += p.untrainable
        c["rows"] += len(p.rows)
        if p.hsa:
            c[f"hsa_{p.hsa}"] += 1
        if p.bare:
            c["bare"] += 1
        if p.status != "ok":
            c[p.status] += 1
            kind = p.reason.split(":", 1)[0] if p.status == "bad" else p.status
            self.reasons[kind] += 1
            if self.reasons[kind] <= LOG_LIMIT:
                where = "" if p.record_id == location else f" ({location})"
                _log.warning("skipping %s record %s%s: %s", p.status, p.record_id, where, p.reason)
                if self.reasons[kind] == LOG_LIMIT:
                    _log.warning("further %s records are counted, not logged", kind)
        if p.rows:
            self._barren = 0
            return
        self._barren += 1
        if self._barren >= self._max_barren:
            raise ValueError(
                f"{self._barren} consecutive records gave no trainable row "
                f"(counts so far: {dict(self.counters)}; reasons: {dict(self.reasons)}); "
                "check the source, seq_len and the truncation policy"
            )

    def get_state(self) -> dict[str, Any]:
        return {**self._before, "next_row": self._next_row}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self.counters = collections.Counter(state["counters"])
        self.reasons = collections.Counter(state["reasons"])
        self._barren = int(state["barren"])
        self._before = {k: state[k] for k in ("parent", "counters", "reasons", "barren")}
        self._rows, self._next_row, self._skip = [], 0, int(state["next_row"])
