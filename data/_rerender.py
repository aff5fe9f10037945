"""Online Harness-State Augmentation: re-render a stored conversation under a fresh HarnessState.

A stored teacher trajectory is one behaviour in one Harness state. Re-rendering it under a
fresh augmentation shows the student the same behaviour in another surface form, for free,
every epoch. What is rebuilt from the new state: the system prompt (blocks, Skill index, tool
descriptions, wording and order), the viewer turn, the tool schemas, the surface names of every
tool call and Skill load, and what `load_skill` returns (the new state's rendering of the
Skill). What stays: the request, the canonical behaviour (which tools, with which arguments,
in which order; which Skills), tool results and the reply. Old surface names mentioned in
reasoning, tool results and Hook messages are rewritten to the new ones; a Hook message keeps
its stored wording otherwise (records with a complete retry history are few, and re-running
the new state's Hooks would need the episode, not the record).

Two things would make the stored targets wrong, so they are pinned or refused:
- numeric constraints (reply length, rounds, ...) are set back to the values the trajectory
  was generated under (`constraints`), since a shorter limit could make the stored reply
  invalid;
- a behaviour the new state cannot express (a called tool or loaded Skill the new state does
  not expose, an argument its schema lacks) raises `RerenderError`; the pipeline then renders
  the record as stored and counts it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from data._convert import Conversation
from hat_jax import harness as hx

_LOAD_SKILL = "load_skill"
assert _LOAD_SKILL in hx.FLOW_TOOLS


class RerenderError(ValueError):
    """The new Harness state cannot express the stored behaviour."""


def pin_constraints(state: hx.HarnessState, constraints: Mapping[str, int]) -> hx.HarnessState:
    """`state` with the given numeric prompt constraints (those the prompt declares)."""
    prompt = state.harness.prompt
    declared = {c.name for c in prompt.constraints}
    for name, value in constraints.items():
        if name in declared and prompt.constraint(name) != int(value):
            prompt = prompt.with_constraint(name, int(value))
    if prompt is state.harness.prompt:
        return state
    return dataclasses.replace(state, harness=dataclasses.replace(state.harness, prompt=prompt))


@dataclasses.dataclass(frozen=True)
class _NameMap:
    """Old surface name -> new surface name, for tools and Skills."""

    tools: dict[str, str]
    skills: dict[str, str]

    def pattern(self) -> re.Pattern | None:
        names = {k for k, v in {**self.tools, **self.skills}.items() if k != v}
        if not names:
            return None
        alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        return re.compile(rf"(?<![\w.\-])({alternatives})(?![\w\-])")

    def substitute(self, text: str, pattern: re.Pattern | None) -> str:
        if pattern is None or not text:
            return text
        both = {**self.skills, **self.tools}
        return pattern.sub(lambda m: both[m[1]], text)


def _used_names(conversation: Conversation, old: hx.RenameMap) -> tuple[set[str], set[str]]:
    """The tools the conversation calls and the Skills it loads (surface names)."""
    used_tools: set[str] = set()
    used_skills: set[str] = set()
    for m in conversation.messages:
        for call in m.get("tool_calls") or ():
            name = call["function"]["name"]
            used_tools.add(name)
            if old.canonical_tool(name) == _LOAD_SKILL:
                args = call["function"].get("arguments") or {}
                if isinstance(args, Mapping) and isinstance(args.get("name"), str):
                    used_skills.add(args["name"])
    return used_tools, used_skills


def loaded_skills(
    conversation: Conversation, renames: Mapping[str, Mapping[str, str]]
) -> frozenset[str]:
    """Canonical names of the Skills the conversation loads (a new state must keep them)."""
    old = hx.RenameMap.from_dict(renames)
    return frozenset(old.canonical_skill(s) for s in _used_names(conversation, old)[1])


def _name_map(
    conversation: Conversation, old: hx.RenameMap, new: hx.HarnessState
) -> tuple[_NameMap, set[str], set[str]]:
    """Maps old to new surface names; returns the map and the tools / Skills actually used."""
    used_tools, used_skills = _used_names(conversation, old)
    offered = {t["function"]["name"] for t in conversation.tools or ()}
    tools, skills = {}, {}
    for name in offered | used_tools:
        surface = new.surface_tool(old.canonical_tool(name))
        if surface is not None:
            tools[name] = surface
    # Old surface names of Skills: renamed ones, loaded ones, and canonical names the old state
    # kept that the new state renames (they may be mentioned in text).
    kept = {c for c in new.renames.skills.values() if old.surface_skill(c) == c}
    for name in set(old.skills) | used_skills | kept:
        surface = new.surface_skill(old.canonical_skill(name))
        if surface is not None:
            skills[name] = surface
    return _NameMap(tools, skills), used_tools, used_skills


def _check_expressible(
    names: _NameMap, used_tools: set[str], used_skills: set[str], conversation: Conversation
) -> None:
    for name in sorted(used_tools - set(names.tools)):
        raise RerenderError(f"{conversation.id}: the new state has no tool for {name!r}")
    for name in sorted(used_skills - set(names.skills)):
        raise RerenderError(f"{conversation.id}: the new state has no Skill for {name!r}")


def _new_call(call: Mapping[str, Any], names: _NameMap, new: hx.HarnessState, conv_id: str):
    fn = call["function"]
    surface = names.tools[fn["name"]]
    args = fn.get("arguments")
    spec = new.harness.tool(surface)
    properties = set(
        (spec.openai_schema()["function"].get("parameters") or {}).get("properties", {})
    )
    if isinstance(args, Mapping):
        missing = set(args) - properties
        if missing and properties:
            raise RerenderError(
                f"{conv_id}: tool {surface!r} of the new state has no argument {sorted(missing)}"
            )
        if new.renames.canonical_tool(surface) == _LOAD_SKILL and "name" in args:
            args = {**args, "name": names.skills[args["name"]]}
    return {**call, "function": {**fn, "name": surface, "arguments": args}}


def rerender(
    conversation: Conversation,
    *,
    request: Mapping[str, Any],
    renames: Mapping[str, Mapping[str, str]],
    new_state: hx.HarnessState,
    constraints: Mapping[str, int] | None = None,
) -> Conversation:
    """The same behaviour in `new_state`'s surface form.

    Args:
      conversation: the stored conversation (system, viewer turn, assistant rounds, tool
        results; after the retry-history policy).
      request: the trajectory's request (`Trajectory.request`).
      renames: the trajectory's RenameMap (`Trajectory.renames`): old surface -> canonical.
      new_state: the fresh Harness state.
      constraints: numeric prompt constraints the trajectory was generated under; pinned.

    Raises:
      RerenderError: the new state cannot express the behaviour.
    """
    msgs = conversation.messages
    if len(msgs) < 2 or msgs[0].get("role") != "system" or msgs[1].get("role") != "user":
        raise RerenderError(f"{conversation.id}: expected a system turn then the viewer turn")
    if constraints:
        new_state = pin_constraints(new_state, constraints)
    old = hx.RenameMap.from_dict(renames)
    names, used_tools, used_skills = _name_map(conversation, old, new_state)
    _check_expressible(names, used_tools, used_skills, conversation)
    pattern = names.pattern()
    sub = lambda text: names.substitute(text, pattern)  # noqa: E731
    req = hx.Request.from_dict(request)
    out = [
        {**msgs[0], "content": hx.build_system_prompt(new_state, req)},
        {**msgs[1], "content": hx.build_user_message(new_state, req)},
    ]
    calls: dict[str, dict[str, Any]] = {}
    for m in msgs[2:]:
        role = m.get("role")
        if role == "assistant":
            new_calls = [
                _new_call(c, names, new_state, conversation.id) for c in m.get("tool_calls") or ()
            ]
            calls = {str(c.get("id")): c for c in new_calls}
            msg = {**m, "content": sub(m.get("content") or "")}
            if m.get("reasoning_content"):
                msg["reasoning_content"] = sub(m["reasoning_content"])
            if new_calls:
                msg["tool_calls"] = new_calls
            out.append(msg)
        elif role == "tool":
            out.append(_new_result(m, calls.get(str(m.get("tool_call_id"))), names, new_state, sub))
        else:
            out.append({**m, "content": sub(m.get("content") or "")})
    return dataclasses.replace(
        conversation, messages=out, tools=[dict(t) for t in hx.tool_schemas(new_state)]
    )


def _is_error(content: str) -> bool:
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, Mapping) and "error" in value


def _new_result(message, call, names: _NameMap, new: hx.HarnessState, sub) -> dict[str, Any]:
    """A tool result in the new state: Skill loads re-rendered, names rewritten elsewhere."""
    name = names.tools.get(message.get("name", ""), message.get("name", ""))
    content = message.get("content")
    if call is not None and new.renames.canonical_tool(call["function"]["name"]) == _LOAD_SKILL:
        skill = new.harness.skill(str((call["function"].get("arguments") or {}).get("name", "")))
        if skill is not None and isinstance(content, str) and not _is_error(content):
            return {**message, "name": name, "content": hx.render_skill(new, skill)}
    if isinstance(content, str):
        content = sub(content)
    return {**message, "name": name, "content": content}
