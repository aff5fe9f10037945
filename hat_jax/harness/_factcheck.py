"""Factual-risk checking: every figure a reply states must be backed by this request's evidence.

Evidence is what the request legitimately knows: the context the prompt pipeline showed
(product spec, retrieved FAQ, room state) and every successful tool result. Viewer comments and
earlier host replies are not evidence. A reply's claims are the figures a viewer would act on:
prices and amounts (`¥149`, `30 yuan`), percentages, stock counts (`12 left`), per-order
limits, day counts and clock times. A claim is supported when its number appears in the
evidence; money may also be the difference of two evidence amounts (a saving), a percentage the
discount between two evidence amounts, a day count an evidence hour count / 24.

Deliberately not covered: qualitative claims ("in stock", "best seller"); the forbidden-claims
hook handles promises, human claims and overreach by pattern.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_ISO_TIME = re.compile(r"T([01]\d|2[0-3]):([0-5]\d)")
_CLOCK = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])")
_MONEY_IN_TEXT = re.compile(r"[¥￥]\s?(\d+(?:\.\d+)?)")
_MONEY_FIELD = re.compile(
    r'"(?:price|list_price|current_price|paid|discount|min_spend|remote_surcharge)":\s*(\d+(?:\.\d+)?)'
)

_CLAIMS = [
    ("money", re.compile(r"[¥￥]\s?(\d+(?:[.,]\d+)?)|\b(?:rmb|cny)\s?(\d+(?:\.\d+)?)", re.I)),
    ("money", re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:yuan\b|rmb\b|cny\b|元|块)", re.I)),
    ("percent", re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:%|percent\b)", re.I)),
    (
        "count",
        re.compile(
            r"\b(\d+)\s+(?:(?:pieces?|units?|items?|pairs?|bottles?|sets?|packs?|sets?)\s+)?(?:left|remaining|in stock|available)\b",
            re.I,
        ),
    ),
    ("count", re.compile(r"\bonly (\d+)\b", re.I)),
    ("count", re.compile(r"\blimit(?:ed)?(?: of| to)? (\d+)\b", re.I)),
    ("days", re.compile(r"\b(\d+)[- ](?:working |business )?days?\b", re.I)),
    ("hours", re.compile(r"\b(\d+)[- ]hours?\b", re.I)),
]
_AMPM = re.compile(r"\b(1[0-2]|0?[1-9])(?::([0-5]\d))?\s?(am|pm|a\.m\.|p\.m\.)", re.I)


def _num(text: str) -> float:
    return round(float(text.replace(",", "")), 2)


class Evidence:
    """Numbers, amounts and clock times this request may state. Add context and tool results
    as they arrive; checking is cheap (sets)."""

    def __init__(self):
        self.numbers: set[float] = set()
        self.money: set[float] = set()
        self.times: set[str] = set()
        self._derived: tuple[set[float], set[float]] | None = None

    def add(self, value: Any) -> None:
        """Collects the numbers, amounts (price-like keys, `¥` figures) and clock times of a JSON
        value. Works on its JSON text: one serialisation and a few C-level regex scans."""
        self._derived = None
        if value is None:
            return
        text = (
            value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        )
        self.numbers.update(_num(m) for m in _NUM.findall(text))
        self.money.update(_num(m) for m in _MONEY_IN_TEXT.findall(text))
        self.money.update(_num(m) for m in _MONEY_FIELD.findall(text))
        self.times.update(f"{int(h):02d}:{m}" for h, m in _ISO_TIME.findall(text))
        self.times.update(f"{int(h):02d}:{m}" for h, m in _CLOCK.findall(text))

    def merge(self, other: Evidence) -> None:
        self._derived = None
        self.numbers |= other.numbers
        self.money |= other.money
        self.times |= other.times

    def _pairs(self) -> tuple[set[float], set[float]]:
        if self._derived is None:
            amounts = sorted(self.money)
            diffs = {round(a - b, 2) for a in amounts for b in amounts if a > b}
            pcts = {round(100 * (a - b) / a) for a in amounts for b in amounts if a > b > 0}
            self._derived = (diffs, pcts | {100 - p for p in pcts})
        return self._derived

    def supports(self, kind: str, value: float) -> bool:
        if value in self.numbers:
            return True
        diffs, pcts = self._pairs()
        if kind == "money":
            return value in diffs
        if kind == "percent":
            return round(value) in pcts
        if kind == "days":
            return value * 24 in self.numbers
        return False


def _clock_claims(text: str) -> list[str]:
    out = [f"{int(h):02d}:{m}" for h, m in _CLOCK.findall(text)]
    for h, m, ampm in _AMPM.findall(text):
        hour = int(h) % 12 + (12 if ampm.lower().startswith("p") else 0)
        out.append(f"{hour:02d}:{m or '00'}")
    return out


def unsupported_claims(text: str, evidence: Evidence) -> list[str]:
    """The figures in `text` that `evidence` does not support, as short phrases."""
    bad: list[str] = []
    for kind, pattern in _CLAIMS:
        for match in pattern.finditer(text):
            raw = next(g for g in match.groups() if g)
            if not evidence.supports(kind, _num(raw)):
                phrase = match.group(0).strip()
                if phrase not in bad:
                    bad.append(phrase)
    for t in _clock_claims(text):
        if t not in evidence.times and f"the time {t}" not in bad:
            bad.append(f"the time {t}")
    return bad
