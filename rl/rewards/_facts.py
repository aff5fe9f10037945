"""Reading a reply: does it state a fact, which figures does it claim.

Deterministic text rules shared by the reward functions. A money fact is stated when the reply
names that amount as money (`¥149`, `149 yuan`, `RMB 149`; zero also as "no minimum" or
"free"); a number when it appears as a whole token; a clock time in 24-hour or am/pm form; a
text fact when enough of its content words (and every number in it) appear; an `any` fact when
its regular expression matches.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

_MONEY = [
    re.compile(r"[¥￥]\s?(\d+(?:\.\d+)?)"),
    re.compile(r"\b(?:rmb|cny)\s?(\d+(?:\.\d+)?)", re.I),
    re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:yuan\b|rmb\b|cny\b|元|块)", re.I),
]
# A zero amount is usually said in words ("no minimum spend", "free").
_NONE = r"\bno minimum|without (?:a )?minimum|\bfree\b"
_CLOCK = re.compile(r"(?<![\d:])([01]?\d|2[0-3])[:.]([0-5]\d)(?![\d:])")
_AMPM = re.compile(r"\b(1[0-2]|0?[1-9])(?::([0-5]\d))?\s?(am|pm|a\.m\.|p\.m\.)", re.I)
_WORD = re.compile(r"[a-z0-9\u4e00-\u9fff]+(?:[.'][a-z0-9]+)*", re.I)
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "for",
        "to",
        "in",
        "on",
        "at",
        "by",
        "with",
        "from",
        "is",
        "are",
        "be",
        "it",
        "its",
        "this",
        "that",
        "as",
        "if",
        "not",
        "your",
        "you",
        "we",
        "our",
        "can",
        "will",
        "per",
    ]
)


def money(text: str) -> set[float]:
    """Amounts the text states as money."""
    out = set()
    for pattern in _MONEY:
        out.update(round(float(m), 2) for m in pattern.findall(text))
    return out


def clock_times(text: str) -> set[str]:
    """Clock times the text states, as HH:MM."""
    out = set()
    for h, m, ampm in _AMPM.findall(text):
        hour = int(h) % 12 + (12 if ampm.lower().startswith("p") else 0)
        out.add(f"{hour:02d}:{m or '00'}")
    rest = _AMPM.sub(" ", text)  # "11:59 pm" is 23:59, not also 11:59
    return out | {f"{int(h):02d}:{m}" for h, m in _CLOCK.findall(rest)}


def has_number(text: str, value: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text) is not None


@functools.lru_cache(maxsize=8192)
def content_words(text: str) -> tuple[str, ...]:
    """Lower-cased content words of `text` (stop words removed), in order, without repeats."""
    words = [w.lower().strip(".'") for w in _WORD.findall(text)]
    return tuple(dict.fromkeys(w for w in words if w and w not in _STOP))


def text_recall(reply: str, value: str) -> tuple[float, bool]:
    """(share of `value`'s content words found in `reply`, whether all its numbers are found)."""
    want = content_words(value)
    if not want:
        return 1.0, True
    have = set(content_words(reply))
    found = sum(w in have for w in want)
    numbers = [w for w in want if any(ch.isdigit() for ch in w)]
    return found / len(want), all(n in have for n in numbers)


def states(reply: str, kind: str, value: str, ratio: float = 0.6) -> bool:
    """Whether `reply` states the fact (`kind`, `value`)."""
    if not reply:
        return False
    if kind == "money":
        amount = round(float(value), 2)
        return amount in money(reply) or (amount == 0 and re.search(_NONE, reply, re.I) is not None)
    if kind == "number":
        return has_number(reply, value)
    if kind == "time":
        return value in clock_times(reply)
    if kind == "any":
        return re.search(value, reply, re.I) is not None
    recall, numbers = text_recall(reply, value)
    return numbers and recall >= ratio - 1e-9


def any_match(patterns: Iterable[str], text: str) -> str | None:
    """The first pattern (case-insensitive regex) that matches `text`, or None."""
    for p in patterns:
        if re.search(p, text, re.I):
            return p
    return None
