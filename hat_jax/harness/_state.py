"""`HarnessState`: a Harness plus the `RenameMap` from its surface names to canonical names.

The policy only ever sees the surface names of the Harness it runs in. Tool executors, rewards
and the simulator work on canonical names (those of the released Harness v0). Resolution of a
surface name goes through exactly one place, `HarnessState.resolve_tool` / `resolve_skill`: a
name resolves only if it is a name of the current Harness, so a renamed tool called by its old
name is an unknown tool, as it would be in production.

`rename_tool` / `rename_skill` rewrite every reference inside the Harness (tool specs, Skills'
`allowed-tools`, `{tool:...}` / `{skill:...}` placeholders in rules, descriptions and prompt
items) and extend the RenameMap, so HSA can rename without breaking consistency. Hook
parameters that name tools (e.g. `requires_tool`) are runtime checks on executed calls and stay
canonical.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from hat_jax.harness._frozen import FrozenDict, freeze
from hat_jax.harness._spec import Harness, Skill

PLACEHOLDER = re.compile(r"\{(tool|skill|const|room):([A-Za-z0-9_.\-]+)\}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RenameMap:
    """Surface name -> canonical name, for tools and Skills. Names absent map to themselves."""

    tools: Mapping[str, str] = dataclasses.field(default_factory=FrozenDict)
    skills: Mapping[str, str] = dataclasses.field(default_factory=FrozenDict)

    def __post_init__(self):
        for kind in ("tools", "skills"):
            mapping = getattr(self, kind)
            if len(set(mapping.values())) != len(mapping):
                raise ValueError(f"RenameMap.{kind} maps two surface names to one canonical name")
            object.__setattr__(self, kind, freeze(mapping))
        object.__setattr__(self, "_tools_inv", {c: s for s, c in self.tools.items()})
        object.__setattr__(self, "_skills_inv", {c: s for s, c in self.skills.items()})

    def canonical_tool(self, surface: str) -> str:
        return self.tools.get(surface, surface)

    def canonical_skill(self, surface: str) -> str:
        return self.skills.get(surface, surface)

    def surface_tool(self, canonical: str) -> str:
        return self._tools_inv.get(canonical, canonical)

    def surface_skill(self, canonical: str) -> str:
        return self._skills_inv.get(canonical, canonical)

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"tools": dict(self.tools), "skills": dict(self.skills)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, str]]) -> RenameMap:
        return cls(tools=dict(data.get("tools", {})), skills=dict(data.get("skills", {})))


def _rename_in_text(text: str, kind: str, old: str, new: str) -> str:
    return text.replace(f"{{{kind}:{old}}}", f"{{{kind}:{new}}}")


def _rename_in_skill(skill: Skill, kind: str, old: str, new: str) -> Skill:
    rules = tuple(
        dataclasses.replace(r, text=_rename_in_text(r.text, kind, old, new)) for r in skill.rules
    )
    allowed = skill.allowed_tools
    if kind == "tool":
        allowed = tuple(new if t == old else t for t in allowed)
    return dataclasses.replace(
        skill,
        name=new if kind == "skill" and skill.name == old else skill.name,
        description=_rename_in_text(skill.description, kind, old, new),
        intro=_rename_in_text(skill.intro, kind, old, new),
        rules=rules,
        allowed_tools=allowed,
    )


def _rename_in_prompt(harness: Harness, kind: str, old: str, new: str):
    blocks = tuple(
        dataclasses.replace(b, items=tuple(_rename_in_text(i, kind, old, new) for i in b.items))
        for b in harness.prompt.blocks
    )
    return dataclasses.replace(harness.prompt, blocks=blocks)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HarnessState:
    """The Harness the policy acts in, and how its names map to canonical names."""

    harness: Harness
    renames: RenameMap = dataclasses.field(default_factory=RenameMap)

    def resolve_tool(self, surface: str) -> str | None:
        """Canonical name of the tool the policy called, or None if this Harness has no such tool."""
        if self.harness.tool(surface) is None:
            return None
        return self.renames.canonical_tool(surface)

    def resolve_skill(self, surface: str) -> str | None:
        if self.harness.skill(surface) is None:
            return None
        return self.renames.canonical_skill(surface)

    def surface_tool(self, canonical: str) -> str | None:
        """The name under which this Harness exposes canonical tool `canonical` (None if absent)."""
        name = self.renames.surface_tool(canonical)
        return name if self.harness.tool(name) is not None else None

    def surface_skill(self, canonical: str) -> str | None:
        name = self.renames.surface_skill(canonical)
        return name if self.harness.skill(name) is not None else None

    @property
    def canonical_tools(self) -> tuple[str, ...]:
        return tuple(self.renames.canonical_tool(t) for t in self.harness.tool_names)

    def rename_tool(self, old: str, new: str) -> HarnessState:
        """A copy in which tool `old` (a surface name) is called `new`, references included."""
        self._check_rename(self.harness.tool_names, "tool", old, new)
        h = self.harness
        tools = tuple(dataclasses.replace(t, name=new) if t.name == old else t for t in h.tools)
        skills = tuple(_rename_in_skill(s, "tool", old, new) for s in h.skills)
        harness = dataclasses.replace(
            h, tools=tools, skills=skills, prompt=_rename_in_prompt(h, "tool", old, new)
        )
        tools_map = {k: v for k, v in self.renames.tools.items() if k != old}
        tools_map[new] = self.renames.canonical_tool(old)
        tools_map = {k: v for k, v in tools_map.items() if k != v}
        renames = dataclasses.replace(self.renames, tools=tools_map)
        return HarnessState(harness=harness, renames=renames)

    def rename_skill(self, old: str, new: str) -> HarnessState:
        """A copy in which Skill `old` (a surface name) is called `new`, references included."""
        self._check_rename(self.harness.skill_names, "skill", old, new)
        h = self.harness
        skills = tuple(_rename_in_skill(s, "skill", old, new) for s in h.skills)
        harness = dataclasses.replace(
            h, skills=skills, prompt=_rename_in_prompt(h, "skill", old, new)
        )
        skills_map = {k: v for k, v in self.renames.skills.items() if k != old}
        skills_map[new] = self.renames.canonical_skill(old)
        skills_map = {k: v for k, v in skills_map.items() if k != v}
        renames = dataclasses.replace(self.renames, skills=skills_map)
        return HarnessState(harness=harness, renames=renames)

    @staticmethod
    def _check_rename(names, kind: str, old: str, new: str) -> None:
        if old not in names:
            raise KeyError(f"no {kind} named {old!r} to rename")
        if new != old and new in names:
            raise ValueError(f"cannot rename {kind} {old!r} to {new!r}: that name is taken")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", new):
            raise ValueError(f"invalid {kind} name {new!r}: use letters, digits, '_', '-', '.'")


def as_state(harness_or_state: Harness | HarnessState) -> HarnessState:
    """Accepts a bare Harness (identity renames) wherever a HarnessState is expected."""
    if isinstance(harness_or_state, HarnessState):
        return harness_or_state
    if isinstance(harness_or_state, Harness):
        return HarnessState(harness=harness_or_state)
    raise TypeError(f"expected a Harness or HarnessState, got {type(harness_or_state).__name__}")


def placeholders(text: str) -> list[tuple[str, str]]:
    """The `(kind, name)` pairs of every `{tool:..}`, `{skill:..}`, `{const:..}`, `{room:..}`."""
    return PLACEHOLDER.findall(text)
