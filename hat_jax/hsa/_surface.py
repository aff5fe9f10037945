"""Two HSA dimensions that reshape what the policy reads first (paper §3.2).

Tool definition: rename tools, rewrite their descriptions and parameter descriptions, reorder
parameters in the schema. The function never changes: parameter names, types and constraints
stay, and executors keep answering on canonical names through the `RenameMap`.

System prompt: reorder top-level blocks and the items within a block, paraphrase items and
block titles, and move numeric constraints within their declared valid ranges, clipped to what
the task needs (`Preserve`).
"""

from __future__ import annotations

import dataclasses

from hat_jax import harness as hx
from hat_jax.hsa._ctx import Ctx

# Numeric prompt constraints and the `Preserve` bound that applies to each.
_BOUNDS = {
    "max_rounds": "min_rounds",
    "reply_max_chars": "min_reply_chars",
    "reply_max_sentences": "min_reply_sentences",
    "history_turns": "min_history_turns",
}


class PreserveError(ValueError):
    """What the task needs cannot be met within the Harness's declared ranges."""


# ------------------------------------------------------------------------------ tool definition
def vary_tool_text(h: hx.Harness, ctx: Ctx) -> hx.Harness:
    """Rewrites tool and parameter descriptions and reorders schema properties."""
    p = ctx.strength
    tools = []
    for t in h.tools:
        description = t.description
        if ctx.chance(p):
            description = ctx.rewriter.rewrite("tool.description", t.description, ctx.rng)
        tools.append(
            dataclasses.replace(t, description=description, parameters=_vary_schema(t, ctx))
        )
    return dataclasses.replace(h, tools=tuple(tools))


def _vary_schema(t: hx.ToolSpec, ctx: Ctx):
    schema = hx.thaw(t.parameters)
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return t.parameters
    for spec in props.values():
        if isinstance(spec, dict) and spec.get("description") and ctx.chance(ctx.strength):
            spec["description"] = ctx.rewriter.rewrite(
                "tool.parameter", spec["description"], ctx.rng
            )
    if len(props) > 1 and ctx.chance(ctx.strength / 2):
        order = list(props)
        ctx.shuffle(order)
        schema["properties"] = {k: props[k] for k in order}
    return hx.freeze(schema)


def plan_tool_renames(state: hx.HarnessState, ctx: Ctx) -> dict[str, str]:
    """Surface name -> new name for each tool picked with probability `strength` (at least
    one)."""
    names = list(state.harness.tool_names)
    chosen = [n for n in names if ctx.chance(ctx.strength)] or [ctx.rng.choice(names)]
    taken = set(state.harness.tool_names) | set(state.harness.skill_names)
    return {n: ctx.fresh_name("tool", ctx.canonical_tool(n), taken) for n in chosen}


# ------------------------------------------------------------------------------ system prompt
def vary_prompt(h: hx.Harness, ctx: Ctx) -> hx.Harness:
    """Reorders blocks and items, rewrites items and titles, moves numeric constraints.

    At least one visible change is guaranteed: if the draw left the prompt as it was, the block
    order is permuted.
    """
    p, prompt = ctx.strength, h.prompt
    blocks = [_vary_block(b, ctx) for b in prompt.blocks]
    if ctx.chance(p):
        ctx.shuffle(blocks)
    constraints = tuple(_move(c, ctx) for c in prompt.constraints)
    new = dataclasses.replace(prompt, blocks=tuple(blocks), constraints=constraints)
    if new == prompt:
        ctx.shuffle(blocks, must_change=True)
        new = dataclasses.replace(new, blocks=tuple(blocks))
    return dataclasses.replace(h, prompt=new)


def _vary_block(b: hx.PromptBlock, ctx: Ctx) -> hx.PromptBlock:
    p = ctx.strength
    items = [
        ctx.rewriter.rewrite("prompt.item", i, ctx.rng) if ctx.chance(p) else i for i in b.items
    ]
    if len(items) > 1 and ctx.chance(p):
        ctx.shuffle(items)
    titles = ctx.bank.block_titles.get(b.id, ())
    title = ctx.rng.choice(titles) if titles and ctx.chance(p) else b.title
    return dataclasses.replace(b, items=tuple(items), title=title)


def constraint_range(c: hx.Constraint, ctx: Ctx) -> tuple[int, int]:
    """The values `c` may take: its declared range, raised to what the task needs."""
    bound = _BOUNDS.get(c.name)
    lo = max(c.min, getattr(ctx.preserve, bound)) if bound else c.min
    if lo > c.max:
        raise PreserveError(
            f"the task needs {c.name} >= {lo}, but its valid range is [{c.min}, {c.max}]"
        )
    return lo, c.max


def _move(c: hx.Constraint, ctx: Ctx) -> hx.Constraint:
    lo, hi = constraint_range(c, ctx)
    if c.value < lo or (hi > lo and ctx.chance(ctx.strength)):
        return dataclasses.replace(c, value=ctx.rng.randint(lo, hi))
    return c
