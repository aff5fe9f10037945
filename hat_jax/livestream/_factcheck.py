"""Factual-risk checking: every figure a reply states must be backed by this request's evidence.

Evidence is what the request legitimately knows: the context the prompt pipeline showed
(product spec, FAQ, room state) and every successful tool result. Viewer comments and earlier
host replies are not evidence. Evidence is typed, so a number only supports a claim of its own
kind: amounts of money come from price-like fields and `¥` figures, counts from stock and
limit fields, day and hour counts from `*_days` / `*_hours` fields and "N days" text, clock
times from timestamps. A saving or a percentage off is supported when it follows from a
(list price, promotion price) pair of the same object.

A reply's claims are the figures a viewer would act on, in English and Chinese: `¥149`,
`30 yuan`, `1元`, `一块钱`, `九块九`, `九毛九`, `25%`, `8折`, `12 left`, `还剩12件`, `limit 2`, `限购2`,
`7 days`, `7天`, `48 hours`, `21:00` / `9 pm` / `晚上9点`. Chinese numerals are read as numbers.
`extra` figure patterns (kind -> language -> expressions, hooks.yaml) extend the grammar. A
number that is not finite is never evidence, and a reply that speaks one ("NaN left") is
unsupported. Identifiers (phone numbers, addresses, order and tracking numbers; patterns from
hooks.yaml) must appear in the evidence's text or the requesting viewer's own words, so the
personal data of other viewers cannot be spoken. Deliberately not covered: qualitative claims
("in stock", "best seller"); the forbidden-claims hook handles promises, human claims and
overreach by pattern.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hat_jax.harness import find_all, fold, lexicon_problems

_CN = "零〇一二两三四五六七八九十百千万"
_N = rf"\d+(?:\.\d+)?|[{_CN}]+"
_CN_DIGIT = {c: i for i, c in enumerate("零一二三四五六七八九")} | {"〇": 0, "两": 2}
_CN_UNIT = {"十": 10, "百": 100, "千": 1000, "万": 10000}

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
    # Chinese: amounts (元 / 块 / 块钱, 九块九), counts, limits, discounts (8折), days, hours.
    (
        "money",
        re.compile(
            rf"((?:{_N})块[一二三四五六七八九\d])(?![\d{_CN}])|({_N})\s?(?:元|块钱|块)(?!儿)"
        ),
    ),
    ("money", re.compile(rf"人民币\s?({_N})")),
    ("money", re.compile(rf"((?:{_N})(?:毛|角)[一二三四五六七八九\d]?)(?![\d{_CN}])")),
    ("count", re.compile(rf"(?:还剩|只剩|剩下|仅剩|库存|现货)\s?({_N})")),
    ("count", re.compile(rf"限购\s?({_N})")),
    ("percent", re.compile(rf"((?:\d+(?:\.\d+)?|[{_CN}]{{1,3}})折)|百分之\s?({_N})")),
    ("days", re.compile(rf"({_N})\s?个?(?:工作日|天)")),
    ("hours", re.compile(rf"({_N})\s?个?(?:小时|钟头)")),
]
_ZH_CLOCK = re.compile(rf"(上午|早上|中午|下午|晚上|今晚)?\s?({_N})\s?点(?:(半)|(\d{{1,2}})分?)?")
_NAN = r"(?:nan|inf(?:inity)?)"
_SPOKEN_NON_FINITE = re.compile(
    rf"[¥￥$]\s?{_NAN}\b|(?<![\w.]){_NAN}\s?(?:(?:left|remaining|in stock|units?|pieces?|yuan|rmb)"
    r"\b|%|元|块|件|个|折)",
    re.I,
)


def _cn_int(text: str) -> int:
    """A Chinese numeral (一百二十, 两万, 十五, 三〇五) as an integer."""
    if all(c in _CN_DIGIT for c in text):
        return int("".join(str(_CN_DIGIT[c]) for c in text))
    total, section, digit = 0, 0, 0
    for c in text:
        if c in _CN_DIGIT:
            digit = _CN_DIGIT[c]
        elif c == "万":
            total, section, digit = (total + section + digit) * 10000, 0, 0
        else:
            section += (digit or 1) * _CN_UNIT[c]
            digit = 0
    return total + section + digit


def _num(text: str) -> float:
    text = text.replace(",", "")
    if text.endswith("折"):  # 8折 = pay 80%, 85折 = 85%
        value = _num(text[:-1])
        return round(value * 10 if value < 10 else value, 2)
    if text[-1] in "毛角" or "毛" in text or "角" in text:  # 九毛九 = 0.99
        jiao, _, fen = text.replace("角", "毛").partition("毛")
        return round(_num(jiao) / 10 + (_num(fen) / 100 if fen else 0), 2)
    if "块" in text:  # 九块九 = 9.9
        whole, tenth = text.split("块")
        return round(_num(whole) + _num(tenth) / 10, 2)
    if text and text[0] in _CN:
        return float(_cn_int(text))
    return round(float(text), 2)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@functools.lru_cache(maxsize=64)
def figure_patterns(extra: Any = None) -> tuple[tuple[str, re.Pattern], ...]:
    """The built-in figure grammar plus `extra` (kind -> lexicon, from hooks.yaml)."""
    added = [
        (kind, re.compile(p, re.I))
        for kind, lexicon in (extra or {}).items()
        for p in (lexicon.values() if isinstance(lexicon, Mapping) else [lexicon])
        for p in ([p] if isinstance(p, str) else p)
    ]
    return (*_PATTERNS, *added)


def figures_problems(extra: Any, field: str) -> list[str]:
    if not isinstance(extra, Mapping):
        return [f"{field} must map figure kinds to lexicons"]
    out = []
    for kind, lexicon in extra.items():
        if kind not in ("money", "percent", "count", "days", "hours"):
            out.append(f"{field}: unknown figure kind {kind!r}")
        out += lexicon_problems(lexicon, f"{field}.{kind}")
    return out


class Evidence:
    """Typed figures this request may state. Add context and tool results as they arrive."""

    def __init__(self, patterns: tuple[tuple[str, re.Pattern], ...] | None = None):
        self.patterns = patterns or figure_patterns()
        self.figures: dict[str, set[float]] = {
            k: set() for k in ("money", "percent", "count", "days", "hours")
        }
        self.times: set[str] = set()
        self.pairs: set[tuple[float, float]] = set()
        self.text: list[str] = []  # folded strings, for identifiers

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
            self.text.append(fold(value))
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
        for kind, pattern in self.patterns:
            for match in pattern.finditer(text):
                self.figures[kind].add(_num(next(g for g in match.groups() if g)))
        self.times.update(f"{int(h):02d}:{m}" for h, m in _ISO_TIME.findall(text))
        self.times.update(f"{int(h):02d}:{m}" for h, m in _CLOCK.findall(text))

    def merge(self, other: Evidence) -> None:
        for kind, values in other.figures.items():
            self.figures[kind] |= values
        self.times |= other.times
        self.pairs |= other.pairs
        self.text += other.text

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
    for part, h, half, m in _ZH_CLOCK.findall(text):
        hour = int(_num(h)) % 24
        if part in ("下午", "晚上", "今晚") and hour < 12:
            hour += 12
        out.append(f"{hour:02d}:{'30' if half else f'{int(m):02d}' if m else '00'}")
    return out


def unsupported_claims(text: str, evidence: Evidence) -> list[str]:
    """The figures in `text` that `evidence` does not support, as short phrases."""
    bad: list[str] = [
        f"a malformed number {m.group(0).strip()!r}" for m in _SPOKEN_NON_FINITE.finditer(text)
    ]
    for kind, pattern in evidence.patterns:
        for match in pattern.finditer(text):
            raw = next(g for g in match.groups() if g)
            phrase = match.group(0).strip()
            if not evidence.supports(kind, _num(raw)) and phrase not in bad:
                bad.append(phrase)
    for t in _clock_claims(text):
        if t not in evidence.times and f"the time {t}" not in bad:
            bad.append(f"the time {t}")
    return bad


def unsupported_identifiers(
    text: str, identifiers: Any, evidence: Evidence, own_words: Iterable[str] = ()
) -> list[str]:
    """Identifiers in `text` (phone numbers, addresses, order numbers: the `identifiers`
    lexicon) that neither the evidence's text nor the requesting viewer's own words contain."""
    found = [f.strip() for f in find_all(identifiers, text)]
    if not found:
        return []
    known = "\n".join([*evidence.text, *(fold(w) for w in own_words)])
    return list(dict.fromkeys(f for f in found if f and f not in known))
