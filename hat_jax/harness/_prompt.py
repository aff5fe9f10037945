"""The system-prompt pipeline: renders a Harness's prompt blocks, Skills and tools for a request.

Block order, item order, wording and numeric constraints all come from `PromptSpec` (data), so
a variant Harness renders a different prompt with no code change. Static text is rendered once
per `HarnessState` (cached); the request-dependent blocks (product, retrieved FAQs, room,
history) are filled per request. Placeholders `{tool:..}`, `{skill:..}`, `{const:..}` and
`{room:..}` are resolved here and nowhere else.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any

from hat_jax.harness._request import Request
from hat_jax.harness._retrieval import rank_faq
from hat_jax.harness._spec import PromptBlock, Skill
from hat_jax.harness._state import PLACEHOLDER, HarnessState

ROOM_FIELDS = ("host_name", "title", "room_id", "now")


def render_text(text: str, state: HarnessState, room: Mapping[str, Any] | None = None) -> str:
    """Substitutes placeholders: tool and Skill names as this Harness spells them, constraint
    values, and live-room fields."""

    def sub(match) -> str:
        kind, name = match[1], match[2]
        if kind == "const":
            return str(state.harness.prompt.constraint(name))
        if kind == "room":
            return str((room or {}).get(name, ""))
        return name

    return PLACEHOLDER.sub(sub, text)


def money(value: float, symbol: str = "¥") -> str:
    """`149.0` -> `¥149`, `12.5` -> `¥12.5`."""
    return f"{symbol}{value:g}"


def clock(iso: str, with_date: bool = True) -> str:
    t = dt.datetime.fromisoformat(iso)
    return t.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M")


def _product_items(p: Mapping[str, Any], sym: str) -> list[str]:
    name = p["name"] + (f" ({p['name_zh']})" if p.get("name_zh") else "")
    items = [
        f"ID: {p['id']}",
        f"Name: {name}",
        f"Brand: {p['brand']}",
        f"List price: {money(p['price'], sym)}",
    ]
    promo = p.get("promotion")
    if promo:
        items.append(
            f"Promotion ({promo['status']}): {money(promo['price'], sym)} {promo['label']}, "
            f"{clock(promo['start'])} to {clock(promo['end'])}, limit {promo['limit_per_order']} per order"
        )
    items.append("Variants: " + ", ".join(p["variants"]))
    items.append("Specs: " + "; ".join(f"{k}: {v}" for k, v in p["specs"].items()))
    s = p["shipping"]
    remote = (
        f"; {', '.join(s['remote_regions'])} +{money(s['remote_surcharge'], sym)}"
        if s["remote_regions"]
        else ""
    )
    items.append(
        f"Shipping: ships within {s['ships_within_hours']} hours by {s['carrier']}, "
        f"{'free shipping' if s['free_shipping'] else 'shipping charged'}, delivery in {s['delivery_days']} days{remote}"
    )
    r = p["returns"]
    window = (
        f"{r['no_reason_days']}-day no-reason returns"
        if r["no_reason_days"]
        else "no no-reason returns"
    )
    items.append(
        f"Returns: {window} ({r['condition']}); quality issues within {r['quality_issue_days']} days; {r['return_shipping']}"
    )
    return items


def _room_items(room: Mapping[str, Any]) -> list[str]:
    items = [f"Time now: {clock(room['now'])}"]
    if room.get("session"):
        items.append(
            f"Live session: {clock(room['session']['start'])} to {clock(room['session']['end'])}"
        )
    if room.get("viewer_count") is not None:
        items.append(f"Viewers online: {room['viewer_count']}")
    if room.get("lineup"):
        items.append(
            "Line-up: " + ", ".join(f"{x['name']} [{x['product_id']}]" for x in room["lineup"])
        )
    for c in room.get("campaigns", ()):
        notes = [
            " (followers only)" if c["followers_only"] else "",
            " (fully claimed)" if c["remaining"] == 0 else "",
        ]
        items.append(f"Coupon campaign: {c['title']}{''.join(notes)}")
    lot = room.get("lottery")
    if lot:
        items.append(
            f"Lottery ({lot['status']}): {lot['prize']} for {lot['winners']} winners, draw at "
            f"{clock(lot['draw_time'], with_date=False)}; to enter, {lot['how_to_enter']}"
        )
    items += [
        f'Host said at {clock(u["at"], with_date=False)}: "{u["text"]}"'
        for u in room.get("anchor_utterances", ())
    ]
    return items


def _dynamic_items(block: PromptBlock, state: HarnessState, request: Request) -> list[str]:
    ctx, prompt = request.context, state.harness.prompt
    sym = ctx.room.get("currency_symbol", "¥")
    if block.source == "skills":
        return list(_skill_index(state))
    if block.source == "product":
        if not ctx.product:
            return ["(no product on screen)"]
        return list(_per_context(ctx, "product", lambda: _product_items(ctx.product, sym)))
    if block.source == "faqs":
        query = " ".join(c.text for c in request.comments)
        hits = rank_faq(query, ctx.faq_pool, prompt.constraint("faq_top_k"))
        return [f"Q: {f['q']} A: {f['a']}" for f in hits] or ["(no related FAQ)"]
    if block.source == "room":
        if not ctx.room:
            return ["(no live-room state)"]
        return list(_per_context(ctx, "room", lambda: _room_items(ctx.room)))
    if block.source == "history":
        n = prompt.constraint("history_turns")
        turns = ctx.history[-n:] if n else ()
        lines = [
            x for t in turns for x in (f"@{t['handle']}: {t['comment']}", f"Host: {t['reply']}")
        ]
        return lines or ["(no earlier conversation)"]
    return []


def _per_context(ctx, key: str, make) -> tuple[str, ...]:
    """A rendering of the (immutable) request context, made once per context."""
    if key not in ctx.renderings:
        ctx.renderings[key] = tuple(make())
    return ctx.renderings[key]


@functools.lru_cache(maxsize=256)
def _skill_index(state: HarnessState) -> tuple[str, ...]:
    return tuple(
        f"{s.name} ({s.kind}): {render_text(s.description, state)}" for s in state.harness.skills
    )


@functools.lru_cache(maxsize=1024)
def _static_items(state: HarnessState, block: PromptBlock, room_key: tuple) -> tuple[str, ...]:
    room = dict(zip(ROOM_FIELDS, room_key))
    return tuple(render_text(item, state, room) for item in block.items)


def build_system_prompt(state: HarnessState, request: Request) -> str:
    """The system prompt for one request: every block in the Harness's order."""
    room_key = tuple(str(request.context.room.get(k, "")) for k in ROOM_FIELDS)
    parts = []
    for block in state.harness.prompt.blocks:
        items = list(_static_items(state, block, room_key))
        if block.source:
            items += _dynamic_items(block, state, request)
        parts.append(f"## {block.title}\n" + "\n".join(f"- {item}" for item in items))
    return "\n\n".join(parts)


def build_user_message(state: HarnessState, request: Request) -> str:
    """The user turn: header, the product on screen, then one line per comment."""
    fmt = state.harness.prompt.user_message
    product = request.context.product or {}
    lines = [fmt.header]
    if product:
        lines.append(
            fmt.on_screen.format_map(
                _Safe(product_name=product.get("name", ""), product_id=product.get("id", ""))
            )
        )
    for i, c in enumerate(request.comments, 1):
        lines.append(
            fmt.comment.format_map(
                _Safe(index=i, handle=c.handle, text=c.text, viewer_id=c.viewer_id)
            )
        )
    return "\n".join(lines)


class _Safe(dict):
    """`str.format_map` mapping that leaves unknown `{fields}` as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def render_skill(state: HarnessState, skill: Skill) -> str:
    """What `load_skill` returns: the Skill's heading, intro and renumbered rules."""
    lines = [f"Skill {skill.name} loaded ({skill.kind}).", f"# {skill.title or skill.name}"]
    if skill.intro:
        lines.append(render_text(skill.intro, state))
    lines += [f"{i}. {render_text(r.text, state)}" for i, r in enumerate(skill.rules, 1)]
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _tool_schemas(state: HarnessState) -> tuple[dict[str, Any], ...]:
    return tuple(t.openai_schema() for t in state.harness.tools)


def tool_schemas(state: HarnessState) -> list[dict[str, Any]]:
    """OpenAI function schemas of every tool, under this Harness's names."""
    return [dict(s) for s in _tool_schemas(state)]


@functools.lru_cache(maxsize=256)
def instruction_text(state: HarnessState) -> str:
    """All instruction text (static prompt items, Skill index and Skill bodies): what a reply
    must never repeat verbatim."""
    items = [render_text(i, state) for b in state.harness.prompt.blocks for i in b.items]
    items += list(_skill_index(state))
    items += [render_skill(state, s) for s in state.harness.skills]
    return "\n".join(items)
