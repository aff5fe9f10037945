"""Many renames in one pass over the Harness.

`HarnessState.rename_tool` / `rename_skill` rebuild every Skill and prompt block per rename,
which made renaming most of an augmentation's cost. `rename_all` applies a whole plan of
renames at once with the same semantics (tests check it equals the one-by-one result): tool and
Skill names, `allowed-tools`, `{tool:..}` / `{skill:..}` placeholders in Skill descriptions,
intros, rules and prompt items, and the composed `RenameMap`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from hat_jax import harness as hx

_REF = re.compile(r"\{(tool|skill):([A-Za-z0-9_.\-]+)\}")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _check(kind: str, names: tuple[str, ...], plan: Mapping[str, str]) -> None:
    targets = list(plan.values())
    if len(set(targets)) != len(targets):
        raise ValueError(f"two {kind}s renamed to the same name: {sorted(targets)}")
    for old, new in plan.items():
        if old not in names:
            raise KeyError(f"no {kind} named {old!r} to rename")
        if new != old and new in names and new not in plan:
            raise ValueError(f"cannot rename {kind} {old!r} to {new!r}: that name is taken")
        if not _NAME.fullmatch(new):
            raise ValueError(f"invalid {kind} name {new!r}: use letters, digits, '_', '-', '.'")


def _compose(current: Mapping[str, str], plan: Mapping[str, str]) -> dict[str, str]:
    """Surface -> canonical after renaming: old keys go, new names map to old's canonical."""
    out = {k: v for k, v in current.items() if k not in plan}
    out.update({new: current.get(old, old) for old, new in plan.items()})
    return {k: v for k, v in out.items() if k != v}


def rename_all(
    state: hx.HarnessState,
    *,
    tools: Mapping[str, str] | None = None,
    skills: Mapping[str, str] | None = None,
) -> hx.HarnessState:
    """`state` with tools and Skills renamed (old surface name -> new), references included."""
    tools, skills, h = dict(tools or {}), dict(skills or {}), state.harness
    _check("tool", h.tool_names, tools)
    _check("skill", h.skill_names, skills)
    if not tools and not skills:
        return state
    plans = {"tool": tools, "skill": skills}

    def sub(text: str) -> str:
        return _REF.sub(lambda m: f"{{{m[1]}:{plans[m[1]].get(m[2], m[2])}}}", text)

    new_skills = tuple(
        dataclasses.replace(
            s,
            name=skills.get(s.name, s.name),
            description=sub(s.description),
            intro=sub(s.intro),
            rules=tuple(dataclasses.replace(r, text=sub(r.text)) for r in s.rules),
            allowed_tools=tuple(tools.get(t, t) for t in s.allowed_tools),
        )
        for s in h.skills
    )
    new_tools = tuple(
        dataclasses.replace(t, name=tools[t.name]) if t.name in tools else t for t in h.tools
    )
    blocks = tuple(
        dataclasses.replace(b, items=tuple(sub(i) for i in b.items)) for b in h.prompt.blocks
    )
    harness = dataclasses.replace(
        h, tools=new_tools, skills=new_skills, prompt=dataclasses.replace(h.prompt, blocks=blocks)
    )
    renames = hx.RenameMap(
        tools=_compose(state.renames.tools, tools), skills=_compose(state.renames.skills, skills)
    )
    return hx.HarnessState(harness=harness, renames=renames)
