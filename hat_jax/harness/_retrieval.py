"""Word tokens and FAQ ranking: the prompt pipeline's FAQ block and a domain's search tools."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

_TOKEN = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "do",
        "does",
        "it",
        "its",
        "this",
        "that",
        "i",
        "me",
        "my",
        "you",
        "your",
        "we",
        "our",
        "to",
        "of",
        "for",
        "in",
        "on",
        "with",
        "and",
        "or",
        "can",
        "could",
        "will",
        "would",
        "how",
        "what",
        "which",
        "when",
        "where",
        "who",
        "there",
        "be",
        "have",
        "has",
        "any",
        "please",
    ]  # noqa: SIM905 - a word list reads better as one string
)


@functools.lru_cache(maxsize=4096)
def _tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in _TOKEN.findall(text.lower()) if t not in _STOP)


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens (CJK characters one by one), stop words removed."""
    return list(_tokens(text))


def rank_faq(query: str, pool: Iterable[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    """FAQ entries by token overlap with the query (question weighted over answer)."""
    q = set(tokens(query))
    scored = []
    for i, f in enumerate(pool):
        score = 2 * len(q.intersection(_tokens(f["q"]))) + len(q.intersection(_tokens(f["a"])))
        if score:
            scored.append((-score, i, f))
    return [f for _, _, f in sorted(scored, key=lambda x: x[:2])[:limit]]
