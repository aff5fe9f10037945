"""The system-prompt pipeline: renders a Harness's prompt blocks, Skills and tools for a request.

Block order, item order, wording and numeric constraints all come from `PromptSpec` (data), so
a variant Harness renders a different prompt with no code change. Static text is rendered once
per `HarnessState` (cached); the request-dependent blocks are filled per request: the
runtime's own sources (`skills`, retrieved `faqs`, `history`) and those of the libraries the
prompt names (`BLOCKS` of each module in prompt.yaml's `libraries`, e.g. the live room's
`product` and `room`), rendered once per request context. Placeholders `{tool:..}`, `{skill:..}`, `{const:..}` and
`{room:..}` are resolved here and nowhere else.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from hat_jax.harness._libraries import ContextBlocks, combined
from hat_jax.harness._request import Request
from hat_jax.harness._retrieval import rank_faq
from hat_jax.harness._spec import PromptBlock, PromptSpec, Skill
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


def context_blocks(prompt: PromptSpec) -> dict:
    """The context blocks a prompt's `libraries` provide (source name -> renderer)."""
    return combined({}, prompt.libraries, "BLOCKS", ContextBlocks)


def _dynamic_items(block: PromptBlock, state: HarnessState, request: Request) -> list[str]:
    ctx, prompt = request.context, state.harness.prompt
    if block.source == "skills":
        return list(_skill_index(state))
    if block.source == "faqs":
        query = " ".join(c.text for c in request.comments)
        hits = rank_faq(query, ctx.faq_pool, prompt.constraint("faq_top_k"))
        return [f"Q: {f['q']} A: {f['a']}" for f in hits] or ["(no related FAQ)"]
    if block.source == "history":
        n = prompt.constraint("history_turns")
        turns = ctx.history[-n:] if n else ()
        lines = [
            x for t in turns for x in (f"@{t['handle']}: {t['comment']}", f"Host: {t['reply']}")
        ]
        return lines or ["(no earlier conversation)"]
    if block.source not in ctx.renderings:
        render = context_blocks(prompt)[block.source]
        ctx.renderings[block.source] = tuple(render(ctx))
    return list(ctx.renderings[block.source])


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
