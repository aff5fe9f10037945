"""Guardrail mechanisms of the runtime for untrusted text: normalisation, structural control
syntax, per-language lexicons and the taint of tool output.

Untrusted text is every viewer comment, handle and display name, and every string inside a tool
result. Two forms of it exist: `normalize_text` is what the policy is shown (NFKC, control
characters and chat-format markup removed), and `fold` is what guardrails match against (NFKC,
format and bidi controls removed, Traditional Chinese converted to Simplified with OpenCC's
`t2s` tables, case folded, look-alike letters and typographic quotes folded, CJK characters
re-joined across inserted spaces), so zero-width splits, full-width forms, mixed scripts,
Traditional characters and capitals do not hide a pattern. Lexicons are therefore written in
Simplified Chinese and English only; `lexicon_problems` refuses an expression that the
Traditional-to-Simplified conversion would change (it could never match folded text). Structural signals (chat special tokens, tool-call blocks,
JSON function calls, forged role turns) are language-independent and are looked for on the
folded raw text, before normalisation removes them. Lexicons are mappings language -> regular
expressions declared in the Harness's hooks.yaml, so operators extend them without code; this
module only validates and compiles them. Which hook uses which mechanism is `_checks`'s part.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

import opencc

_CONTROL = {"Cf": "", "Cc": " ", "Cs": "", "Co": "", "Cn": ""}
# Chat-format control strings a viewer could type to forge turns: special tokens such as
# `<|im_end|>` (the tokenizer would encode them as the real control token) and the format's tags.
_FORMAT_MARKUP = re.compile(r"<\|[^<>|\s]{1,48}\|>|</?(?:think|tool_call|tool_response)>", re.I)
# Latin look-alikes from other scripts (Cyrillic, Greek) that NFKC keeps apart, and typographic
# quotes: folded so "іgnore" or "I’m" match the same lexicon entries as their ASCII spelling.
_LOOKALIKE = str.maketrans(
    "аеорсухіјԁһкмтвнѕοαερτυνικχ‘’`´“”",
    "aeopcyxijdhkmtbhsoaeptuvikx''''\"\"",
)
_CJK = "\u3400-\u9fff\uf900-\ufaff"
_CJK_GAP = re.compile(rf"(?<=[{_CJK}])\s+(?=[{_CJK}])")
_HAS_CJK = re.compile(rf"[{_CJK}]")
_NON_FINITE = frozenset({"nan", "-nan", "inf", "-inf", "+inf", "infinity", "-infinity"})


def _strip_controls(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    # Format characters (zero-width, bidi overrides) vanish; other controls become spaces.
    return "".join(_CONTROL.get(unicodedata.category(ch), ch) for ch in text)


def normalize_text(text: str, max_chars: int) -> str:
    """NFKC; chat-format markup, control/format/private-use characters removed; whitespace
    collapsed; capped. What the policy is shown of untrusted text."""
    # Bound the work first: a megabyte comment must cost no more than a long one.
    text = text[: 4 * max_chars + 64]
    if not (text.isascii() and text.isprintable()):
        text = _strip_controls(text)
    # After NFKC and control removal, so full-width or zero-width-split markup is caught too.
    text = _FORMAT_MARKUP.sub(" ", text)
    text = " ".join(text.split())
    if len(text) > max_chars:
        text = text[:max_chars].rsplit(" ", 1)[0].rstrip() + " ..."
    return text


def strip_markup(text: str) -> str:
    """`text` with chat-format markup removed (and nothing else changed)."""
    return _FORMAT_MARKUP.sub(" ", text) if "<" in text or "\uff1c" in text else text


@functools.cache
def _t2s() -> opencc.OpenCC:
    return opencc.OpenCC("t2s.json")


def to_simplified(text: str) -> str:
    """`text` with Traditional Chinese characters and phrases converted to Simplified (OpenCC's
    maintained `t2s` tables); text without CJK characters is returned as it is."""
    return _t2s().convert(text) if _HAS_CJK.search(text) else text


@functools.lru_cache(maxsize=4096)
def fold(text: str, max_chars: int = 8192) -> str:
    """The matching form of untrusted text (see module docstring); bounded by `max_chars`."""
    text = text[: 4 * max_chars + 64]
    if not (text.isascii() and text.isprintable()):
        text = to_simplified(_strip_controls(text))
    text = " ".join(text.casefold().translate(_LOOKALIKE).split())
    return _CJK_GAP.sub("", text)[:max_chars]


# ---------------------------------------------------------------------------------- lexicons
def regex_list_problems(patterns: Any, field: str) -> list[str]:
    if not isinstance(patterns, list | tuple) or not patterns:
        return [f"{field} must be a non-empty list of regular expressions"]
    out = []
    for i, p in enumerate(patterns):
        try:
            re.compile(p)
        except (re.error, TypeError) as err:
            out.append(f"{field}[{i}] is not a valid regular expression: {err}")
            continue
        if (simplified := to_simplified(p)) != p:
            out.append(
                f"{field}[{i}] has Traditional Chinese characters, which folded text never holds:"
                f" write {simplified!r}"
            )
    return out


def lexicon_problems(lexicon: Any, field: str) -> list[str]:
    """Problems of a lexicon: a mapping language -> non-empty list of regular expressions (a
    plain list is one unnamed language)."""
    if isinstance(lexicon, list | tuple):
        return regex_list_problems(lexicon, field)
    if not isinstance(lexicon, Mapping) or not lexicon:
        return [f"{field} must map languages to lists of regular expressions"]
    out = []
    for lang, patterns in lexicon.items():
        out += regex_list_problems(patterns, f"{field}.{lang}")
    return out


def lexicon_patterns(lexicon: Any) -> tuple[str, ...]:
    """Every expression of a lexicon (all languages), in declaration order."""
    if lexicon is None:
        return ()
    if isinstance(lexicon, Mapping):
        return tuple(p for patterns in lexicon.values() for p in patterns)
    return tuple(lexicon)


@functools.lru_cache(maxsize=256)
def compiled_patterns(patterns: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


def search(lexicon: Any, text: str) -> str | None:
    """The first span of folded `text` that `lexicon` matches, or None."""
    patterns = lexicon_patterns(lexicon)
    if not patterns or not text:
        return None
    m = compiled_patterns(patterns).search(fold(text))
    return m.group(0) if m else None


def find_all(lexicon: Any, text: str) -> list[str]:
    """Every span of folded `text` that `lexicon` matches, in order."""
    patterns = lexicon_patterns(lexicon)
    if not patterns or not text:
        return []
    return [m.group(0) for m in compiled_patterns(patterns).finditer(fold(text))]


# ---------------------------------------------------------------------------------- tool output
def strings(value: Any, limit: int = 512):
    """The strings of a JSON value (keys and values), at most `limit` of them."""
    stack, seen = [value], 0
    while stack and seen < limit:
        v = stack.pop()
        if isinstance(v, str):
            seen += 1
            yield v
        elif isinstance(v, Mapping):
            stack += [*v.values(), *(k for k in v if isinstance(k, str))]
        elif isinstance(v, list | tuple):
            stack += list(v)


def non_finite(value: Any) -> bool:
    """Whether a JSON value holds a NaN or infinite number, or a string that spells one."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, str) and len(v) < 12 and v.strip().casefold() in _NON_FINITE:
            return True
        if isinstance(v, Mapping):
            stack += list(v.values())
        elif isinstance(v, list | tuple):
            stack += list(v)
    return False


def withhold(value: Any, tainted: set[str], note: str) -> Any:
    """`value` with each tainted string replaced by `note` and markup removed from the rest."""
    if isinstance(value, str):
        return note if value in tainted else strip_markup(value)
    if isinstance(value, Mapping):
        return {k: withhold(v, tainted, note) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [withhold(v, tainted, note) for v in value]
    return value
