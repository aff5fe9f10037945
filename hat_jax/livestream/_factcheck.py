"""Factual-risk checking: every figure a reply states must be backed by this request's evidence.

Evidence is what the request legitimately knows: the context the prompt pipeline showed
(product spec, FAQ, room state) and every successful tool result. Viewer comments and earlier
host replies are not evidence. Evidence is typed, so a number only supports a claim of its own
kind: amounts of money come from price-like fields and `¥` figures, counts from stock and
limit fields, day and hour counts from `*_days` / `*_hours` fields and "N days" text, clock
times from timestamps. A saving or a percentage off is supported when it follows from a
(list price, promotion price) pair of the same object.

A reply's claims are the figures a viewer would act on: `¥149`, `30 yuan`, `25%`, `12 left`,
`limit 2`, `7 days`, `48 hours`, `21:00` / `9 pm`. Deliberately not covered: qualitative
claims ("in stock", "best seller"); the forbidden-claims hook handles promises, human claims
and overreach by pattern.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_ISO_TIME = re.compile(r"T([01]\d|2[0-3]):([0-5]\d)")
_CLOCK = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])")
_AMPM = re.compile(r"\b(1[0-2]|0?[1-9])(?::([0-5]\d))?\s?(am|pm|a\.m\.|p\.m\.)", re.I)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_DIGIT = re.compile(r"\d")
_MONEY_KEYS = frozenset(
    {"price", "list_price", "current_price", "paid", "discount", "min_spend", "remote_surcharge"}
)
_COUNT_KEYS = frozenset(
    {"total", "limit_per_order", "winners", "remaining", "quantity", "per_viewer_limit"}
)

# (kind, pattern): the first non-empty group is the figure. Used on replies and on evidence text.
_PATTERNS = [
    ("money", re.compile(r"[¥￥]\s?(\d+(?:[.,]\d+)?)|\b(?:rmb|cny)\s?(\d+(?:\.\d+)?)", re.I)),
    ("money", re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:yuan\b|rmb\b|cny\b|元|块)", re.I)),
    ("percent", re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:%|percent\b)", re.I)),
    (
        "count",
        re.compile(
            r"\b(\d+)\s+(?:(?:pieces?|units?|items?|pairs?|bottles?|sets?|packs?)\s+)?(?:left|remaining|in stock|available)\b",
            re.I,
        ),
    ),
    ("count", re.compile(r"\bonly (\d+)\b", re.I)),
    ("count", re.compile(r"\blimit(?:ed)?(?: of| to)? (\d+)\b", re.I)),
    ("days", re.compile(r"\b(?:\d+\s?[-–]\s?)?(\d+)[- ](?:working |business )?days?\b", re.I)),
    ("days", re.compile(r"\b(\d+)\s?[-–]\s?\d+[- ](?:working |business )?days?\b", re.I)),
    ("hours", re.compile(r"\b(\d+)[- ]hours?\b", re.I)),
]


def _num(text: str) -> float:
    return round(float(text.replace(",", "")), 2)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Evidence:
    """Typed figures this request may state. Add context and tool results as they arrive."""

    def __init__(self):
        self.figures: dict[str, set[float]] = {
            k: set() for k in ("money", "percent", "count", "days", "hours")
        }
        self.times: set[str] = set()
        self.pairs: set[tuple[float, float]] = set()

    def add(self, value: Any) -> None:
        """Walks a JSON value and records its figures by kind (see module docstring)."""
        texts: list[str] = []
        self._walk(value, "", texts)
        if texts:  # one scan per pattern over all strings of the value
            self._add_text("\n".join(texts))

    def _walk(self, value: Any, key: str, texts: list[str]) -> None:
        if _is_number(value):
            kind = "money" if key in _MONEY_KEYS else "count" if key in _COUNT_KEYS else None
            kind = kind or (
                "days" if key.endswith("_days") else "hours" if key.endswith("_hours") else None
            )
            if kind:
                self.figures[kind].add(round(float(value), 2))
        elif isinstance(value, str):
            if key.endswith(("_days", "_hours")):
                kind = "days" if key.endswith("_days") else "hours"
                self.figures[kind].update(_num(m) for m in _NUMBER.findall(value))
            if _DIGIT.search(value):
                texts.append(value)
        elif isinstance(value, Mapping):
            self._walk_mapping(value, texts)
        elif isinstance(value, list | tuple):
            for v in value:
                self._walk(v, key, texts)

    def _walk_mapping(self, value: Mapping[str, Any], texts: list[str]) -> None:
        for k, v in value.items():
            if k == "stock" and isinstance(v, Mapping):
                self.figures["count"].update(
                    round(float(n), 2) for n in v.values() if _is_number(n)
                )
            else:
                self._walk(v, str(k), texts)
        list_price = value.get("list_price", value.get("price"))
        promo = value.get("promotion")
        for low in (
            value.get("current_price"),
            promo.get("price") if isinstance(promo, Mapping) else None,
        ):
            if _is_number(list_price) and _is_number(low) and 0 < low < list_price:
                self.pairs.add((float(list_price), float(low)))

    def _add_text(self, text: str) -> None:
        for kind, pattern in _PATTERNS:
            for match in pattern.finditer(text):
                self.figures[kind].add(_num(next(g for g in match.groups() if g)))
        self.times.update(f"{int(h):02d}:{m}" for h, m in _ISO_TIME.findall(text))
        self.times.update(f"{int(h):02d}:{m}" for h, m in _CLOCK.findall(text))

    def merge(self, other: Evidence) -> None:
        for kind, values in other.figures.items():
            self.figures[kind] |= values
        self.times |= other.times
        self.pairs |= other.pairs

    def supports(self, kind: str, value: float) -> bool:
        if value in self.figures[kind]:
            return True
        if kind == "money":
            return any(abs((a - b) - value) < 0.005 for a, b in self.pairs)
        if kind == "percent":
            offs = [100 * (a - b) / a for a, b in self.pairs]
            return any(value in (int(p), round(p), int(100 - p), round(100 - p)) for p in offs)
        if kind == "days":
            return value * 24 in self.figures["hours"]
        if kind == "hours":
            return value / 24 in self.figures["days"]
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
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            raw = next(g for g in match.groups() if g)
            phrase = match.group(0).strip()
            if not evidence.supports(kind, _num(raw)) and phrase not in bad:
                bad.append(phrase)
    for t in _clock_claims(text):
        if t not in evidence.times and f"the time {t}" not in bad:
            bad.append(f"the time {t}")
    return bad
