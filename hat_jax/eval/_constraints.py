"""Instruction constraints of T3 Prompt Robustness: a bank of templates, checked by rule.

Each constraint is a plain dict (`{"type": ..., <parameters>}`) with an instruction text that
goes into the item's system prompt. They are valid for the live room (an operator could issue
any of them for a session) and each is checked by rule on the final reply or the trajectory:

- `address_viewer`: the public reply starts with the viewer's `@handle`;
- `mention_phrase`: the public reply contains `phrase` (case-insensitive);
- `max_chars`: the public reply is shorter than `value` characters;
- `end_question`: the public reply ends with a question mark;
- `avoid_competitor`: no reply (public or private) names the competitor `name`;
- `tool_order`: a successful call of `first` comes before the first call of `then` (for
  items whose gold calls include both; scored by TCO, not by LLM).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rl.sim import GoldCall

REPLY_TYPES = ("address_viewer", "mention_phrase", "max_chars", "end_question", "avoid_competitor")
ORDER_TYPE = "tool_order"
PHRASES = ("happy shopping", "thanks for watching", "stay tuned", "see you in the next live")
CHAR_LIMITS = (140, 160, 180)
COMPETITORS = ("MegaMart", "ShopRush", "DealHub", "BuyNest")
# (first, then) pairs an operator may require, with the instruction that states them.
ORDERS: dict[tuple[str, str], str] = {
    ("check_inventory", "get_price_promotion"): (
        "Before quoting any price, call {tool:check_inventory} to confirm the item is in stock, "
        "then {tool:get_price_promotion}."
    ),
}
_SUCCEEDED = (None, "tool_error")
_MISTAKES = ("unknown_tool", "invalid_arguments", "not_allowed")


def text(c: Mapping[str, Any]) -> str:
    """The instruction that states constraint `c` (placeholders resolved by the prompt)."""
    kind = c["type"]
    if kind == "address_viewer":
        return "Start every public reply by addressing the viewer by name, with their @handle."
    if kind == "mention_phrase":
        return f'Say the phrase "{c["phrase"]}" in every public reply.'
    if kind == "max_chars":
        return f"Keep every public reply under {c['value']} characters."
    if kind == "end_question":
        return "End every public reply with a short question to the viewer."
    if kind == "avoid_competitor":
        return f"Never mention the competitor {c['name']} or compare prices with it."
    if kind == ORDER_TYPE:
        return ORDERS[(c["first"], c["then"])]
    raise ValueError(f"unknown prompt constraint {kind!r}; known: {(*REPLY_TYPES, ORDER_TYPE)}")


def draw(rng: random.Random, *, handle: str, gold_tools: set[str]) -> list[dict[str, Any]]:
    """One to three reply constraints (distinct types), plus a tool order when the gold calls
    include both of its tools."""
    kinds = rng.sample(REPLY_TYPES, rng.choice((1, 2, 2, 3)))
    out: list[dict[str, Any]] = []
    for kind in REPLY_TYPES:  # bank order: the prompt reads the same for equal draws
        if kind not in kinds:
            continue
        c: dict[str, Any] = {"type": kind}
        if kind == "address_viewer":
            c["handle"] = handle
        elif kind == "mention_phrase":
            c["phrase"] = rng.choice(PHRASES)
        elif kind == "max_chars":
            c["value"] = rng.choice(CHAR_LIMITS)
        elif kind == "avoid_competitor":
            c["name"] = rng.choice(COMPETITORS)
        out.append(c)
    for first, then in ORDERS:
        if {first, then} <= gold_tools:
            out.append({"type": ORDER_TYPE, "first": first, "then": then})
    return out


def holds(c: Mapping[str, Any], public: str, private: str = "") -> bool:
    """Whether the final reply (`public`, `private`) meets reply constraint `c`."""
    kind, reply = c["type"], public.strip()
    if kind == "address_viewer":
        return reply.lower().startswith(f"@{c['handle']}".lower())
    if kind == "mention_phrase":
        return " ".join(c["phrase"].lower().split()) in " ".join(reply.lower().split())
    if kind == "max_chars":
        return 0 < len(reply) < c["value"]
    if kind == "end_question":
        return reply.endswith(("?", "？"))
    if kind == "avoid_competitor":
        pattern = rf"(?<![a-z0-9]){re.escape(c['name'])}(?![a-z0-9])"
        return re.search(pattern, f"{public} {private}", re.I) is None
    raise ValueError(f"{kind!r} is not a reply constraint; known: {REPLY_TYPES}")


def order_holds(
    calls: Sequence[Any], gold: Sequence[GoldCall], orders: Sequence[tuple[str, str]] = ()
) -> tuple[bool, list[str]]:
    """TCO: every required call is made, after its predecessors succeeded.

    Args:
      calls: the trajectory's `ToolRecord`s (canonical names), in call order; calls the Harness
        refused (unknown tool, invalid arguments, not allowed) never ran and are skipped.
      gold: the required calls; their `after` tools are predecessors.
      orders: further `(first, then)` pairs: `first` must succeed before any call of `then`.

    Returns:
      (whether the order holds, why not).
    """
    ran = [r for r in calls if r.canonical and r.error not in _MISTAKES]
    why = []
    for pattern in gold:
        before = set(pattern.after) | {a for a, b in orders if b == pattern.tool}
        at = next((i for i, r in enumerate(ran) if pattern.matches(r.canonical, r.arguments)), None)
        if at is None:
            why.append(f"{pattern.tool} never called")
            continue
        done = {r.canonical for r in ran[:at] if r.error in _SUCCEEDED}
        if missing := sorted(before - done):
            why.append(f"{pattern.tool} called before {', '.join(missing)}")
    for first, then in orders:
        at = next((i for i, r in enumerate(ran) if r.canonical == then), None)
        done = {r.canonical for r in ran[: len(ran) if at is None else at] if r.error in _SUCCEEDED}
        if at is not None and first not in done:
            why.append(f"{then} called before {first}")
    return not why, sorted(set(why))
