"""The number-word parser of the claim checks (`hat_jax.livestream._numbers`): digits <-> words
round trips in English and Chinese (words written by small generators here), the colloquial
Chinese forms, and the rewriting of a reply's number words as digits."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hat_jax import harness as hx
from hat_jax.livestream import _numbers as numbers

_ONES = [
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
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def en_words(n: int, *, hyphen: bool = True, and_: bool = False) -> str:
    """English words for 0 <= n < 10**9 ("three hundred and five", "twenty-one")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (("-" if hyphen else " ") + _ONES[ones] if ones else "")
    for scale, name in ((1_000_000, "million"), (1000, "thousand"), (100, "hundred")):
        if n >= scale:
            head, rest = divmod(n, scale)
            out = f"{en_words(head, hyphen=hyphen)} {name}"
            if rest:
                out += (" and " if and_ and rest < 100 else " ") + en_words(
                    rest, hyphen=hyphen, and_=and_
                )
            return out
    raise AssertionError(n)


_ZH = "零一二三四五六七八九"


def zh_words(n: int, *, liang: bool = False) -> str:
    """Canonical Chinese numerals for 0 <= n < 10**8 (一百零五, 三万零五, 十九)."""
    if n == 0:
        return "零"

    def below_10k(k: int, leading: bool) -> str:
        out, zero = "", False
        for unit, name in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
            d = k // unit % 10
            if d == 0:
                zero = bool(out)
                continue
            if zero:
                out += "零"
                zero = False
            if unit == 10 and d == 1 and not out and leading:
                out += "十"  # 十九, not 一十九, at the start of the number
            else:
                digit = "两" if liang and d == 2 and unit >= 100 else _ZH[d]
                out += digit + name
        return out

    high, low = divmod(n, 10_000)
    if not high:
        return below_10k(low, True)
    out = below_10k(high, True) + "万"
    if low:
        out += ("零" if low < 1000 else "") + below_10k(low, False)
    return out


@given(st.integers(0, 999_999_999), st.booleans(), st.booleans())
def test_english_words_round_trip(n, hyphen, and_):
    text = en_words(n, hyphen=hyphen, and_=and_)
    assert numbers.parse_en(text) == n, text
    assert numbers.parse(text) == n


@given(st.integers(0, 99_999_999), st.booleans())
def test_chinese_numerals_round_trip(n, liang):
    text = zh_words(n, liang=liang)
    assert numbers.parse_zh(text) == n, text
    assert numbers.parse(text) == n


@given(st.integers(0, 99_999_999))
def test_traditional_numerals_fold_to_the_same_number(n):
    text = zh_words(n, liang=True).replace("万", "萬").replace("两", "兩")
    assert numbers.parse_zh(hx.fold(text)) == n


@given(st.integers(10, 9999))
def test_words_in_a_reply_become_digits(n):
    en = f"ok, {en_words(n)} yuan for you"
    assert numbers.words_to_digits(en) == f"ok, {n} yuan for you"
    zh = f"好的，{zh_words(n)}元给你"
    assert numbers.words_to_digits(zh) == f"好的，{n}元给你"


@pytest.mark.parametrize(
    "text,value",
    [
        ("a dozen", 12),
        ("two dozen", 24),
        ("a hundred", 100),
        ("one hundred and five", 105),
        ("两百五", 250),
        ("一万二", 12000),
        ("三〇五", 305),
        ("两半", 2.5),
        ("一亿两千万", 120_000_000),
        ("149", 149),
        ("banana", None),
        ("一下", None),
    ],
)
def test_parse_examples(text, value):
    assert numbers.parse(text) == value


@pytest.mark.parametrize(
    "text,expected",
    [
        ("deal, one dollar and it's yours!", "deal, 1 dollar and it's yours!"),
        ("this one is great, one of our best", "this one is great, one of our best"),
        ("only five left", "only 5 left"),
        ("a dozen for 七十三块", "12 for 73块"),
        ("十分好看，万一不合适可以退", "十分好看，万一不合适可以退"),
        ("四五天到", "四五天到"),
        ("someone often said none", "someone often said none"),
    ],
)
def test_words_to_digits_examples(text, expected):
    assert numbers.words_to_digits(text) == expected
