"""Cross-module validation of a Harness: references resolve, schemas are JSON Schema, hooks
exist and are configured for the point and action they support.

Runs after loading and on any derived Harness (HSA output). Problems name the module's source
file (or the module itself for in-memory Harnesses) and the field.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

import jsonschema

from hat_jax.harness._frozen import canonical_json, thaw
from hat_jax.harness._hooks import checks_for
from hat_jax.harness._libraries import LibraryError
from hat_jax.harness._loader import Problem
from hat_jax.harness._prompt import ROOM_FIELDS, context_blocks
from hat_jax.harness._spec import CONTEXT_ARGS, FLOW_TOOLS, RUNTIME_SOURCES, Harness
from hat_jax.harness._state import RenameMap, placeholders


def _check_placeholders(
    text: str, harness: Harness, file: str, field: str, out: list[Problem]
) -> None:
    consts = {c.name for c in harness.prompt.constraints}
    for kind, name in placeholders(text):
        known = {
            "tool": harness.tool(name) is not None,
            "skill": harness.skill(name) is not None,
            "const": name in consts,
            "room": name in ROOM_FIELDS,
        }[kind]
        if not known:
            out.append(
                Problem(file, field, f"placeholder {{{kind}:{name}}} names an unknown {kind}")
            )


@functools.lru_cache(maxsize=4096)
def _schema_error(schema_json: str) -> tuple[str, str] | None:
    """(where, message) of the first meta-schema violation of a schema, or None.

    Meta-validation costs milliseconds per schema and derived Harnesses (HSA draws) repeat the
    same schemas many times, so results are cached by the schema's canonical JSON.
    """
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as err:
        return "/".join(map(str, err.absolute_path)) or "<root>", err.message
    return None


def _check_tools(harness: Harness, out: list[Problem]) -> None:
    seen = set()
    for i, t in enumerate(harness.tools):
        file, field = t.source or f"tool {t.name}", f"tools[{i}]"
        if t.name in seen:
            out.append(Problem(file, f"{field}.name", f"duplicate tool name {t.name!r}"))
        seen.add(t.name)
        schema = thaw(t.parameters)
        error = _schema_error(canonical_json(schema))
        if error is not None:
            where, message = error
            out.append(
                Problem(
                    file, f"{field}.parameters", f"not a valid JSON Schema at {where}: {message}"
                )
            )
            continue
        if schema.get("type") != "object":
            out.append(Problem(file, f"{field}.parameters", "top-level type must be 'object'"))
        for arg in t.context_args:
            if arg not in CONTEXT_ARGS:
                out.append(
                    Problem(file, f"{field}.context_args", f"{arg!r} is not one of {CONTEXT_ARGS}")
                )
            if arg in schema.get("properties", {}):
                out.append(
                    Problem(
                        file,
                        f"{field}.parameters",
                        f"context argument {arg!r} must not be a policy-visible parameter",
                    )
                )
        if t.provider != "builtin":
            server = t.provider.removeprefix("mcp:")
            if not t.provider.startswith("mcp:") or server not in harness.mcp_servers:
                out.append(
                    Problem(
                        file,
                        f"{field}.provider",
                        f"{t.provider!r} is neither 'builtin' nor 'mcp:<declared server>'",
                    )
                )


def _check_skills(harness: Harness, out: list[Problem]) -> None:
    names = [s.name for s in harness.skills]
    for s in harness.skills:
        file = s.source or f"skill {s.name}"
        if names.count(s.name) > 1:
            out.append(Problem(file, "name", f"duplicate Skill name {s.name!r}"))
        for tool in s.allowed_tools:
            if harness.tool(tool) is None:
                out.append(Problem(file, "allowed-tools", f"unknown tool {tool!r}"))
        for field, text in (("description", s.description), ("body", s.intro)):
            _check_placeholders(text, harness, file, field, out)
        for i, r in enumerate(s.rules, 1):
            _check_placeholders(r.text, harness, file, f"rule {i}", out)
    if not any(s.kind == "reply" for s in harness.skills):
        out.append(Problem("skills/", "kind", "at least one Reply Skill is required"))


def _check_prompt(harness: Harness, out: list[Problem]) -> None:
    p, file = harness.prompt, harness.prompt.source or "prompt"
    try:
        sources = set(RUNTIME_SOURCES) | set(context_blocks(p))
    except LibraryError as err:
        out.append(Problem(file, "libraries", str(err)))
        sources = None
    ids = [b.id for b in p.blocks]
    for i, b in enumerate(p.blocks):
        if ids.count(b.id) > 1:
            out.append(Problem(file, f"blocks[{i}].id", f"duplicate block id {b.id!r}"))
        if b.source and sources is not None and b.source not in sources:
            out.append(
                Problem(
                    file,
                    f"blocks[{i}].source",
                    f"no context block named {b.source!r}; known: {sorted(sources)}",
                )
            )
        for j, item in enumerate(b.items):
            _check_placeholders(item, harness, file, f"blocks[{i}].items[{j}]", out)
    names = [c.name for c in p.constraints]
    for i, c in enumerate(p.constraints):
        if names.count(c.name) > 1:
            out.append(Problem(file, f"constraints[{i}].name", f"duplicate constraint {c.name!r}"))
    for needed in (
        "reply_max_chars",
        "reply_max_sentences",
        "max_rounds",
        "faq_top_k",
        "history_turns",
    ):
        if needed not in names:
            out.append(Problem(file, "constraints", f"the runtime needs constraint {needed!r}"))


def _check_hooks(harness: Harness, canonical: set[str], out: list[Problem]) -> None:
    spec, file = harness.hooks, harness.hooks.source or "hooks"
    try:
        checks = checks_for(spec)
    except LibraryError as err:
        out.append(Problem(file, "libraries", str(err)))
        return
    names = [h.name for h in spec.hooks]
    for i, h in enumerate(spec.hooks):
        field = f"hooks[{i}]"
        impl = checks.get(h.name)
        if names.count(h.name) > 1:
            out.append(Problem(file, f"{field}.name", f"duplicate hook {h.name!r}"))
        if impl is None:
            out.append(
                Problem(
                    file,
                    f"{field}.name",
                    f"no hook implementation named {h.name!r}; known: {sorted(checks)}",
                )
            )
            continue
        if h.point != impl.point:
            out.append(
                Problem(file, f"{field}.point", f"{h.name} runs at {impl.point!r}, not {h.point!r}")
            )
        if h.action not in impl.actions:
            out.append(
                Problem(
                    file,
                    f"{field}.action",
                    f"{h.name} supports actions {impl.actions}, not {h.action!r}",
                )
            )
        if impl.check_params:
            out += [
                Problem(file, f"{field}.{msg.split(' ', 1)[0]}", msg)
                for msg in impl.check_params(h.params)
            ]
        for j, claim in enumerate(
            h.params.get("claims", ()) if h.name == "forbidden_claims" else ()
        ):
            tool = claim.get("requires_tool")
            if tool and tool not in canonical:
                out.append(
                    Problem(
                        file,
                        f"{field}.params.claims[{j}].requires_tool",
                        f"unknown canonical tool {tool!r}",
                    )
                )
    if spec.fallback.on_failure not in ("conservative", "suppress"):
        out.append(Problem(file, "fallback.on_failure", "must be 'conservative' or 'suppress'"))


def _check_side_effect_rules(harness: Harness, renames: RenameMap, out: list[Problem]) -> None:
    """Every side-effect tool has its rule in `injection_guard`'s `params.side_effects` (when
    the hook states rules), naming canonical Skills that allow the tool."""
    spec, file = harness.hooks, harness.hooks.source or "hooks"
    rule = next((h for h in spec.hooks if h.name == "injection_guard"), None)
    rules = rule.params.get("side_effects") if rule is not None else None
    if not isinstance(rules, Mapping):
        return
    field = "hooks[injection_guard].params.side_effects"
    effects = {renames.canonical_tool(t.name): t.name for t in harness.tools if t.side_effects}
    for tool in sorted(set(effects) - set(rules)):
        out.append(Problem(file, field, f"the side-effect tool {tool!r} has no rule"))
    for tool, r in rules.items():
        if tool not in effects:
            out.append(Problem(file, f"{field}.{tool}", "names no side-effect tool of the Harness"))
            continue
        for name in r.get("skills", ()) if isinstance(r, Mapping) else ():
            skill = harness.skill(renames.surface_skill(name))
            if skill is None or effects[tool] not in skill.allowed_tools:
                out.append(
                    Problem(
                        file,
                        f"{field}.{tool}.skills",
                        f"{name!r} is not a Skill of the Harness that allows {tool}",
                    )
                )


def validate_harness(harness: Harness, renames: RenameMap | None = None) -> list[Problem]:
    """Every consistency problem of `harness` (see module docstring)."""
    renames = renames or RenameMap()
    out: list[Problem] = []
    _check_tools(harness, out)
    _check_skills(harness, out)
    _check_prompt(harness, out)
    canonical = {renames.canonical_tool(t) for t in harness.tool_names}
    _check_hooks(harness, canonical, out)
    _check_side_effect_rules(harness, renames, out)
    for flow in FLOW_TOOLS:
        if flow not in canonical:
            out.append(
                Problem(
                    "tools.json",
                    "tools",
                    f"the flow-control tool {flow!r} is required by the agent loop",
                )
            )
    return out
