"""`changes`: what an augmentation changed, per dimension, in words.

Compares a variant with its base on canonical terms (placeholders mapped back through the
`RenameMap`), so a renamed tool mentioned in a paraphrased rule counts as one rename and one
paraphrase, not as noise. Used for corpus statistics and to check that a dimension touched
only what it owns.
"""

from __future__ import annotations

import re

from hat_jax import harness as hx
from hat_jax.hsa._augment import Dim
from hat_jax.hsa._skills import link_mentions

_REF = re.compile(r"\{(tool|skill):([A-Za-z0-9_.\-]+)\}")


def _canon(text: str, renames: hx.RenameMap) -> str:
    def sub(m):
        kind, name = m[1], m[2]
        return f"{{{kind}:{renames.canonical_tool(name) if kind == 'tool' else renames.canonical_skill(name)}}}"

    return _REF.sub(sub, " ".join(text.split()))


def changes(base: hx.Harness, state: hx.HarnessState) -> dict[Dim, list[str]]:
    """Per dimension, a list of human-readable changes from `base` to `state`."""
    base, h, r = link_mentions(base), state.harness, state.renames
    out = {d: [] for d in Dim}
    _skill_changes(base, h, r, out)
    _tool_changes(base, h, r, out)
    _prompt_changes(base, h, r, out)
    _hook_changes(base, h, out)
    return out


def _skill_changes(base, h, r, out) -> None:
    ids, content = out[Dim.SKILL_ID], out[Dim.SKILL_CONTENT]
    present = {r.canonical_skill(s.name): s for s in h.skills}
    for s in base.skills:
        new = present.get(s.name)
        if new is None:
            ids.append(f"masked Skill {s.name}")
            continue
        if new.name != s.name:
            ids.append(f"renamed Skill {s.name} -> {new.name}")
        if _canon(new.description, r) != _canon(s.description, r):
            ids.append(f"rewrote the description of {s.name}")
        old_rules = {x.id: x for x in s.rules}
        new_ids = [x.id for x in new.rules]
        for x in new.rules:
            if _canon(x.text, r) != _canon(old_rules[x.id].text, r):
                content.append(f"paraphrased rule {x.id}")
        content += [f"masked rule {i}" for i in old_rules if i not in new_ids]
        if [i for i in old_rules if i in new_ids] != new_ids:
            content.append(f"reordered the rules of {s.name}")
        if new.intro != s.intro or new.title != s.title:
            content.append(f"rewrote the intro or heading of {s.name}")
    known = {s.name for s in base.skills}
    ids += [f"added Skill {s.name}" for s in h.skills if r.canonical_skill(s.name) not in known]
    order = [r.canonical_skill(s.name) for s in h.skills if r.canonical_skill(s.name) in known]
    if order != [s.name for s in base.skills if s.name in order]:
        ids.append("reordered the Skill index")


def _tool_changes(base, h, r, out) -> None:
    tools = out[Dim.TOOL_DEF]
    present = {r.canonical_tool(t.name): t for t in h.tools}
    for t in base.tools:
        new = present[t.name]
        if new.name != t.name:
            tools.append(f"renamed tool {t.name} -> {new.name}")
        if new.description != t.description:
            tools.append(f"rewrote the description of {t.name}")
        if hx.thaw(new.parameters) != hx.thaw(t.parameters):
            tools.append(f"rewrote or reordered the parameters of {t.name}")
        elif list(new.parameters.get("properties", {})) != list(t.parameters.get("properties", {})):
            tools.append(f"reordered the parameters of {t.name}")


def _prompt_changes(base, h, r, out) -> None:
    prompt = out[Dim.SYSTEM_PROMPT]
    old, new = base.prompt, h.prompt
    if [b.id for b in new.blocks] != [b.id for b in old.blocks]:
        prompt.append("reordered the prompt blocks")
    blocks = {b.id: b for b in old.blocks}
    for b in new.blocks:
        o = blocks[b.id]
        if b.title != o.title:
            prompt.append(f"retitled block {b.id}")
        old_items = [_canon(i, r) for i in o.items]
        new_items = [_canon(i, r) for i in b.items]
        if sorted(new_items) != sorted(old_items):
            prompt.append(f"rewrote items of block {b.id}")
        elif new_items != old_items:
            prompt.append(f"reordered items of block {b.id}")
    for c in new.constraints:
        before = old.constraint(c.name)
        if c.value != before:
            prompt.append(f"moved {c.name} {before} -> {c.value}")


def _hook_changes(base, h, out) -> None:
    hooks = out[Dim.HOOK]
    old, new = base.hooks, h.hooks
    if new.envelope != old.envelope:
        hooks.append("changed the hook-message envelope")
    if h.prompt.user_message != base.prompt.user_message:
        hooks.append("changed the layout of viewer comments")
    if new.max_total_retries != old.max_total_retries:
        hooks.append(f"retry budget {old.max_total_retries} -> {new.max_total_retries}")
    if new.fallback != old.fallback:
        hooks.append("changed the fallback")
    for rule in new.hooks:
        o = old.rule(rule.name)
        for field in ("action", "max_retries", "message", "params", "enabled"):
            if getattr(rule, field) != getattr(o, field):
                hooks.append(f"{rule.name}: changed {field}")
