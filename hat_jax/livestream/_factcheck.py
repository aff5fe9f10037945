"""Factual-risk checking: every figure a reply states must be backed by this request's evidence.

Evidence is what the request legitimately knows: the context the prompt pipeline showed
(product spec, FAQ, room state) and every successful tool result that carried no instructions
(a tainted result backs nothing, see `sanitize_tool_output`). Viewer comments and earlier host
replies are not evidence. Evidence is typed, so a number only supports a claim of its own kind:
amounts of money come from price-like fields and `¥` figures, counts from stock and limit
fields only (never from prose, so a count planted in a tool result's free text backs nothing),
day and hour counts from `*_days` / `*_hours` fields and "N days" text, clock times from
timestamps. A saving or a percentage off is supported when it follows from a (list price,
promotion price) pair of the same object.

A reply's claims are the figures a viewer would act on, in English and Chinese: `¥149`, `$89`,
`30 yuan`, `1元`, `一块钱`, `九块九`, `九毛九`, `25%`, `8折`, `半价`, `12 left`, `还剩12件`,
`limit 2`, `限购2`, `a refund of 500`, `退你500`, `7 days`, `7天`, `48 hours`, `21:00` / `9 pm` /
`晚上9点`; and every other number, which must occur somewhere in the evidence. Number words are
read by one parser (`_numbers`: `one dollar`, `eighty-nine`, `十九`, `两百五`), on text folded by
the runtime (Traditional characters read as Simplified). `extra` figure patterns (kind ->
language -> expressions, hooks.yaml) extend the grammar. A number that is not finite is never
evidence, and a reply that speaks one ("NaN left") is unsupported. Identifiers (phone numbers,
addresses, order and tracking numbers: patterns from hooks.yaml; codes mixing letters and
digits) must appear in the evidence's text, so neither another viewer's personal data nor a
made-up code is spoken. The viewer's own figures and identifiers are never evidence: they may
be repeated only in a clause that attributes them to the viewer ("you mentioned 89 yuan", "I
couldn't find order DD...", "你说的89元"). Deliberately not covered: qualitative claims ("in
stock", "best seller"); the forbidden-claims hook handles promises, human claims and overreach
by pattern.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hat_jax.harness import find_all, fold, lexicon_problems
from hat_jax.livestream._numbers import ZH_NUMERAL, parse_zh, words_to_digits

_CN = ZH_NUMERAL
_N = rf"\d+(?:\.\d+)?|[{_CN}]+"

_ISO_TIME = re.compile(r"T([01]\d|2[0-3]):([0-5]\d)", re.I)
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
    ("money", re.compile(r"[¥￥$]\s?(\d+(?:[.,]\d+)?)|\b(?:rmb|cny)\s?(\d+(?:\.\d+)?)", re.I)),
    (
        "money",
        re.compile(
            r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:yuan\b|rmb\b|cny\b|dollars?\b|bucks?\b|美元|美金|元|块)",
            re.I,
        ),
    ),
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
    # A refund is money: "a refund of 500", "refund you 500", "退你500", "退款500".
    ("money", re.compile(r"\brefund(?:ed)?(?: of| you| back)?\s(\d+(?:\.\d+)?)\b(?![-:])", re.I)),
    ("money", re.compile(rf"退(?:款|还|回|给你|你|您)*\s?({_N})")),
    ("money", re.compile(rf"((?:{_N})(?:毛|角)[一二三四五六七八九\d]?)(?![\d{_CN}])")),
    ("count", re.compile(rf"(?:还剩|只剩|剩下|仅剩|库存|现货)\s?({_N})")),
    ("count", re.compile(rf"限购\s?({_N})")),
    ("percent", re.compile(rf"((?:\d+(?:\.\d+)?|[{_CN}]{{1,3}})折)|百分之\s?({_N})|(半)价")),
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


def _num(text: str) -> float:
    text = text.replace(",", "")
    if text == "半":  # 半价: pay half
        return 50.0
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
        value = parse_zh(text)
        return float("nan") if value is None else float(value)
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
        self.numbers: set[float] = set()  # every finite number, for figures without a unit

    def add(self, value: Any) -> None:
        """Walks a JSON value and records its figures by kind (see module docstring)."""
        texts: list[str] = []
        self._walk(value, "", texts)
        if texts:  # one scan per pattern over all strings of the value
            self._add_text("\n".join(texts))

    def _walk(self, value: Any, key: str, texts: list[str]) -> None:
        if _is_number(value):
            self.numbers.add(round(float(value), 2))
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
            texts.append(value)  # digits or number words ("air it for one to two days")
        elif isinstance(value, Mapping):
            self._walk_mapping(value, texts)
        elif isinstance(value, list | tuple):
            for v in value:
                self._walk(v, key, texts)

    def _walk_mapping(self, value: Mapping[str, Any], texts: list[str]) -> None:
        for k, v in value.items():
            if isinstance(k, str) and _DIGIT.search(k):  # variant keys: {"38": 12, "45 mm": 0}
                texts.append(k)
                self.text.append(fold(k))
            if k == "stock" and isinstance(v, Mapping):
                texts += [str(variant) for variant in v]
                counts = {round(float(n), 2) for n in v.values() if _is_number(n)}
                self.figures["count"] |= counts
                self.numbers |= counts
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
        text = words_to_digits(fold(text, 1 << 20))
        self.numbers.update(round(float(n), 2) for n in _NUMBER.findall(text))
        for kind, pattern in self.patterns:
            if kind == "count":  # counts come from count fields, never from prose (see above)
                continue
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
        self.numbers |= other.numbers

    def supports(self, kind: str, value: float) -> bool:
        """Whether a figure of `kind` ("number": one without a unit) is backed."""
        if kind == "number":
            return value in self.numbers or any(
                self.supports(k, value) for k in ("money", "percent")
            )
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


def _clock_claims(text: str) -> list[tuple[str, tuple[int, int]]]:
    out = [(f"{int(m[1]):02d}:{m[2]}", m.span()) for m in _CLOCK.finditer(text)]
    for m in _AMPM.finditer(text):
        hour = int(m[1]) % 12 + (12 if m[3].lower().startswith("p") else 0)
        out.append((f"{hour:02d}:{m[2] or '00'}", m.span()))
    for m in _ZH_CLOCK.finditer(text):
        part, h, half, minute = m.groups()
        hour = int(_num(h)) % 24 if _num(h) == _num(h) else 99
        if part in ("下午", "晚上", "今晚") and hour < 12:
            hour += 12
        out.append(
            (f"{hour:02d}:{'30' if half else f'{int(minute):02d}' if minute else '00'}", m.span())
        )
    return out


# A clause that attributes a figure or identifier to the viewer ("you mentioned 89 yuan", "你说
# 的89元") or says it was not found ("I couldn't find order DD..."): there, and only there, the
# viewer's own figures and identifiers may be repeated, as theirs. Clauses end at commas too.
_QUOTE = re.compile(
    r"\byou (?:just )?(?:mentioned|said|wrote|quoted|asked about|saw|typed|gave)\b"
    r"|\b(?:couldn't|could not|can't|cannot|didn't|did not|was unable to|were unable to)"
    r" (?:find|locate|see)\b"
    r"|(?:你|您)(?:刚才|刚刚)?(?:说|提到|写|看到|给)的?|(?:找不到|没有找到|没找到|查不到|没有查到)"
)
_CLAUSE = re.compile(r"[^.;!?,。；！？，\n]+")


def _attributed(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _CLAUSE.finditer(text) if _QUOTE.search(m.group(0))]


def _viewer_numbers(words: Iterable[str]) -> set[float]:
    text = words_to_digits(fold(" ".join(words)))
    out = {round(float(n), 2) for n in _NUMBER.findall(text)}
    for _, pattern in figure_patterns():
        for match in pattern.finditer(text):
            out.add(_num(next(g for g in match.groups() if g)))
    return out


def _inside(pos: int, spans: Iterable[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in spans)


def unsupported_claims(
    text: str, evidence: Evidence, viewer_words: Iterable[str] = ()
) -> list[str]:
    """The figures in `text` that `evidence` does not support, as short phrases.

    A figure is a typed claim of the grammar (money, percent, count, days, hours, clock
    times) or any other number, in digits or in words (`_numbers`); a number without a unit
    needs the same number somewhere in the evidence. The viewer's own figures (`viewer_words`)
    are never evidence: they may be repeated only in a clause that attributes them to the
    viewer ("you mentioned 89 yuan").
    """
    text = words_to_digits(fold(text))
    bad: list[str] = [
        f"a malformed number {m.group(0).strip()!r}" for m in _SPOKEN_NON_FINITE.finditer(text)
    ]
    quoted = _attributed(text)
    theirs = _viewer_numbers(viewer_words) if quoted else set()
    claimed: list[tuple[int, int]] = []

    def check(kind: str, value: float, phrase: str, span: tuple[int, int]) -> None:
        claimed.append(span)
        if evidence.supports(kind, value) or phrase in bad:
            return
        if value in theirs and _inside(span[0], quoted):
            return
        bad.append(phrase)

    for kind, pattern in evidence.patterns:
        for match in pattern.finditer(text):
            raw = next(g for g in match.groups() if g)
            check(kind, _num(raw), match.group(0).strip(), match.span())
    for t, span in _clock_claims(text):
        claimed.append(span)
        if t not in evidence.times and f"the time {t}" not in bad:
            bad.append(f"the time {t}")
    for match in _NUMBER.finditer(text):
        if not _inside(match.start(), claimed):
            check("number", round(float(match.group(0)), 2), match.group(0), match.span())
    return bad


# Codes that mix letters and digits (order, coupon, tracking and product ids), except
# measurements and clock times.
_CODE = re.compile(r"(?<![\w-])(?=[\w-]*[a-z])(?=[\w-]*\d)[a-z0-9]+(?:-[a-z0-9]+)*(?![\w-])")
_MEASURE = re.compile(
    r"\d+(?:am|pm|st|nd|rd|th|ml|l|g|kg|mg|cm|mm|m|km|mah|w|v|gb|tb|mb|k|x|h|hrs?|min|s|pcs)"
    r"|\d+(?:-[a-z]+)+"  # "12-month", "30-day": a number and its unit, checked as a number
)


def unsupported_identifiers(
    text: str, identifiers: Any, evidence: Evidence, own_words: Iterable[str] = ()
) -> list[str]:
    """Identifiers in `text` (phone numbers, addresses, order numbers: the `identifiers`
    lexicon; codes mixing letters and digits) that the evidence's text does not contain. The
    requesting viewer's own words (`own_words`) support one only in a clause that attributes
    it to them, so no other viewer's data and no made-up code is spoken as fact."""
    folded = fold(text)
    found = [f.strip() for f in find_all(identifiers, text)]
    found += [m.group(0) for m in _CODE.finditer(folded) if not _MEASURE.fullmatch(m.group(0))]
    if not found:
        return []
    known = "\n".join(evidence.text)
    own = "\n".join(fold(w) for w in own_words)
    quoted = "\n".join(folded[a:b] for a, b in _attributed(folded))
    return list(
        dict.fromkeys(f for f in found if f and f not in known and not (f in own and f in quoted))
    )
