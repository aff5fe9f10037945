"""Number words as figures: the one parser the claim checks use for English and Chinese.

English: `zero` ... `nineteen`, the tens, `hundred`, `thousand`, `million`, `dozen`, joined by
spaces, hyphens or `and` (`one hundred and five`, `twenty-five`, `a dozen`, `two thousand`).
Chinese: the digits `零〇一二两三四五六七八九` with the units `十百千万亿` (`十九`, `两百五十`,
`三万零五`, `一千二百`), digit strings (`三〇五`), a trailing `半` for a half (`两个半` is not a
number, `两半` is 2.5), and the colloquial short forms `两百五` (250) and `一万二` (12000), where a
last digit without its unit takes the unit one below the one before it.

`words_to_digits` rewrites the number words of a reply as digits, so one digit grammar reads
every figure: English words always when they are compound or scaled (`eighty-nine`, `three
hundred`, `a dozen`) and otherwise when a unit follows (`one dollar`, `five left`); Chinese
numerals when they carry a unit character (`五百`, `十九`; a lone `十` before a unit), except the idioms in which they do
not count anything (`十分`, `万一`, `千万`, `百分百`). Text is expected folded (`harness.fold`):
lower case, Simplified characters.

Deliberately not covered: ordinals (`first`), fractions other than a Chinese half, `half` in
English, and Chinese numerals without a unit character (`四五天`: four or five days; `一下`),
which the typed figure grammar of `_factcheck` reads where a unit follows.
"""

from __future__ import annotations

import re

EN_ONES = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
        ]
    )
}
EN_TENS = {
    w: 10 * i
    for i, w in enumerate(
        ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], 2
    )
}
EN_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_EN_WORD = "|".join(sorted([*EN_ONES, *EN_TENS, *EN_SCALES, "dozen"], key=len, reverse=True))
_EN_RUN = re.compile(
    rf"\b(?:an?[\s-]+(?=(?:hundred|thousand|million|dozen)\b))?(?:{_EN_WORD})"
    rf"(?:(?:[\s-]+(?:and[\s-]+)?)(?:{_EN_WORD}))*\b"
)
# Units after which a lone small number word is a figure ("one dollar", "five left").
_EN_UNIT = re.compile(
    r"\s?(?:dollars?|bucks?|yuan|rmb|cny|percent|%|left|remaining|pieces?|units?|items?|pairs?"
    r"|bottles?|sets?|packs?|days?|hours?|weeks?|months?|orders?|coupons?|元|块|件|个|天|折)",
)

ZH_DIGITS = {c: i for i, c in enumerate("零一二三四五六七八九")} | {"〇": 0, "两": 2}
ZH_UNITS = {"十": 10, "百": 100, "千": 1000}
ZH_BIG = {"万": 10_000, "亿": 100_000_000}
ZH_NUMERAL = "零〇一二两三四五六七八九十百千万亿"
_ZH_RUN = re.compile(rf"[{ZH_NUMERAL}]+半?")
_ZH_COUNTED = frozenset("元块件个天折%")
_ZH_IDIOMS = ("十分", "万一", "千万", "百分百", "百分之", "一一", "万万")


def parse_en(text: str) -> int | None:
    """An English number in words (`twenty-five`, `a dozen`, `one hundred and five`), or None."""
    tokens = [t for t in re.split(r"[\s-]+", text.strip().casefold()) if t and t != "and"]
    if not tokens:
        return None
    total, current, seen = 0, 0, False
    for tok in tokens:
        if tok in ("a", "an"):
            current, seen = max(current, 1), True
        elif tok in EN_ONES or tok in EN_TENS:
            current, seen = current + EN_ONES.get(tok, EN_TENS.get(tok, 0)), True
        elif tok == "hundred":
            current, seen = (current or 1) * 100, True
        elif tok == "dozen":
            current, seen = (current or 1) * 12, True
        elif tok in EN_SCALES:
            total, current, seen = total + (current or 1) * EN_SCALES[tok], 0, True
        else:
            return None
    return total + current if seen else None


def parse_zh(text: str) -> float | None:
    """A Chinese numeral (`十九`, `两百五十`, `三万零五`, `三〇五`, `两百五`, `一万二`, `两半`), or
    None when `text` is not one."""
    half = text.endswith("半")
    body = text[:-1] if half else text
    if not body or any(c not in ZH_DIGITS and c not in ZH_UNITS and c not in ZH_BIG for c in body):
        return None
    if all(c in ZH_DIGITS for c in body):
        value = int("".join(str(ZH_DIGITS[c]) for c in body))
        return value + 0.5 if half else value
    total, section, digit, last_unit = 0, 0, 0, 1
    for c in body:
        if c in ZH_DIGITS:
            digit = ZH_DIGITS[c]
        elif c in ZH_UNITS:
            last_unit = ZH_UNITS[c]
            section += (digit or 1) * last_unit
            digit = 0
        else:
            big = ZH_BIG[c]
            total = (
                (total + section + digit) * big if big > total else total + (section + digit) * big
            )
            section, digit, last_unit = 0, 0, big
    # 两百五 = 250, 一万二 = 12000: a trailing digit after a unit, with no 零 between, counts in
    # the unit one below (not after 十, where 十五 = 15).
    if digit and last_unit > 10 and body[-2] not in "零〇":
        digit *= last_unit // 10
    value = total + section + digit
    return value + 0.5 if half else value


def parse(text: str) -> float | None:
    """A number in digits, English words or Chinese numerals, or None."""
    text = text.strip().replace(",", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    value = parse_en(text) if text.isascii() else parse_zh(text)
    return None if value is None else float(value)


def _digits(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _en_sub(m: re.Match) -> str:
    run, after = m.group(0), m.string[m.end() : m.end() + 12]
    tokens = re.split(r"[\s-]+", run)
    scaled = len(tokens) > 1 or tokens[0] in EN_TENS or tokens[0] in EN_SCALES
    if not scaled and not _EN_UNIT.match(after):
        return run  # "this one", "one of them"
    value = parse_en(run)
    return run if value is None else _digits(value)


def _zh_sub(m: re.Match) -> str:
    run = m.group(0)
    around = m.string[max(0, m.start() - 1) : m.end() + 2]
    if not any(c in ZH_UNITS or c in ZH_BIG for c in run):
        return run
    if len(run) < 2 and m.string[m.end() : m.end() + 1] not in _ZH_COUNTED:
        return run  # 十 alone counts only before a unit (十元, not 十足)
    if any(idiom in around for idiom in _ZH_IDIOMS):
        return run
    value = parse_zh(run)
    return run if value is None else _digits(value)


def words_to_digits(text: str) -> str:
    """Folded `text` with its number words written as digits (see module docstring)."""
    if not text.isascii():
        text = _ZH_RUN.sub(_zh_sub, text)
    return _EN_RUN.sub(_en_sub, text)
