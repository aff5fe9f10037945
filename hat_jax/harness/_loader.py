# Over 400 lines: every file of a Harness is loaded and checked here: all problems in one pass.
"""Loads a Harness directory into the frozen `Harness` tree and validates it.

Layout (`data/livestream/harness/` is the bundled v0):

    harness.yaml            name, release, description
    tools.json              tool registry (JSON Schema parameters) and MCP servers
    prompt.yaml             system-prompt blocks, numeric constraints, user-message templates
    hooks.yaml              hooks per lifecycle point, retry budget, fallback
    skills/<name>/SKILL.md  Agent-Skills modules (YAML front matter + numbered rules)

A plain Agent Skills folder loads too: its front matter needs only `name` (equal to the folder)
and `description`; this project's fields default to `metadata.version` "1.0.0",
`metadata.kind` "strategy" (so a generic Skill never stands in for the Reply Skill a
substantive reply requires; set `kind: reply` to make it one), no `metadata.critical-rules`
and no `allowed-tools`. Numbered rules are required only of Skills that set `metadata.kind`;
a plain Skill's body without them is kept as its intro text.

Every problem found is reported at once, each naming the file and the field, so an operator can
fix a broken edit in one pass. `validate` re-runs the cross-module checks on any Harness (for
example one produced by HSA).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import yaml

from hat_jax.harness._spec import (
    HOOK_ACTIONS,
    HOOK_POINTS,
    SKILL_KINDS,
    TOOL_CATEGORIES,
    Constraint,
    Fallback,
    Harness,
    HookRule,
    HookSpec,
    PromptBlock,
    PromptSpec,
    Rule,
    Skill,
    ToolSpec,
    UserMessageFormat,
)

_SKILL_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n(.*))?\Z", re.DOTALL)
_RULE_LINE = re.compile(r"^(\d+)[.)]\s+(.*)$")
ROOM_FIELDS = ("host_name", "title", "room_id", "now")
DEFAULT_SKILL_VERSION = "1.0.0"
DEFAULT_SKILL_KIND = "strategy"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One validation problem: the file, the field inside it, and what is wrong."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


class HarnessError(ValueError):
    """A Harness failed to load or validate; `.problems` lists every problem found."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        lines = "\n  ".join(str(p) for p in self.problems)
        super().__init__(f"invalid Harness ({len(self.problems)} problem(s)):\n  {lines}")


class _Reader:
    """Typed field access that records a `Problem` instead of raising."""

    def __init__(self, file: str, problems: list[Problem]):
        self.file, self.problems = file, problems

    def problem(self, field: str, message: str) -> None:
        self.problems.append(Problem(self.file, field, message))

    def get(self, data: Any, key: str, types, path: str = "", *, default: Any = ..., check=None):
        field = f"{path}.{key}" if path else key
        if not isinstance(data, Mapping):
            self.problem(path or "<root>", f"expected a mapping, got {type(data).__name__}")
            return None if default is ... else default
        if key not in data or data[key] is None:
            if default is ...:
                self.problem(field, "missing")
                return None
            return default
        value = data[key]
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            names = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            self.problem(field, f"expected {names}, got {type(value).__name__} {value!r:.60}")
            return None if default is ... else default
        if check is not None and (err := check(value)):
            self.problem(field, err)
        return value


def _parse_yaml(text: str, file: str, problems: list[Problem], line_offset: int = 0) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1 + line_offset}, column {mark.column + 1}" if mark else "?"
        problems.append(
            Problem(file, "<yaml>", f"invalid YAML at {where}: {getattr(err, 'problem', err)}")
        )
        return None


def _read(root: pathlib.Path, rel: str, problems: list[Problem]) -> Any:
    path = root / rel
    if not path.is_file():
        problems.append(Problem(rel, "<file>", f"missing (looked in {root})"))
        return None
    text = path.read_text(encoding="utf-8")
    if rel.endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            problems.append(
                Problem(
                    rel,
                    "<json>",
                    f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}",
                )
            )
            return None
    return _parse_yaml(text, rel, problems)


def _string_list(r: _Reader, data, key: str, path: str) -> tuple[str, ...]:
    value = r.get(data, key, (list, str), path, default=[])
    if isinstance(value, str):
        return tuple(value.split())
    if any(not isinstance(v, str) for v in value):
        r.problem(f"{path}.{key}" if path else key, "every entry must be a string")
        return ()
    return tuple(value)


def _parse_body(text: str, rel: str, problems: list[Problem], *, require_rules: bool):
    title, intro, rules = "", [], []
    for line in text.splitlines():
        stripped = line.strip()
        match = _RULE_LINE.match(stripped)
        if not title and not rules and not intro and stripped.startswith("# "):
            title = stripped[2:].strip()
        elif match:
            rules.append([int(match[1]), match[2].strip()])
        elif rules:
            if stripped:
                rules[-1][1] += " " + stripped
        elif stripped or intro:
            intro.append(stripped)
    numbers = [n for n, _ in rules]
    if not rules and require_rules:
        problems.append(Problem(rel, "body", "no numbered rules ('1. ...') found"))
    elif rules and numbers != list(range(1, len(rules) + 1)):
        problems.append(
            Problem(
                rel, "body", f"rules must be numbered 1..{len(rules)} in order, found {numbers}"
            )
        )
    return title, " ".join(" ".join(intro).split()), [text for _, text in rules]


def load_skill(path: pathlib.Path, rel: str, problems: list[Problem]) -> Skill | None:
    """Parses one `SKILL.md` (folder name must equal the `name` field; a plain Agent Skill gets
    the defaults of this module's docstring)."""
    r = _Reader(rel, problems)
    match = _FRONT_MATTER.match(path.read_text(encoding="utf-8"))
    if not match:
        r.problem(
            "front matter", "SKILL.md must start with a YAML front matter block between '---' lines"
        )
        return None
    meta = _parse_yaml(match[1], rel, problems, line_offset=1)
    if not isinstance(meta, Mapping):
        if meta is not None:
            r.problem("front matter", f"expected a mapping, got {type(meta).__name__}")
        return None
    for key in ("name", "description"):
        if meta.get(key) is None:
            r.problem(key, "missing: every SKILL.md front matter needs a name and a description")
    name = r.get(
        meta,
        "name",
        str,
        default=None,
        check=lambda v: (
            None
            if _SKILL_NAME.match(v) and len(v) <= 64
            else "use 1-64 lowercase letters, digits and single hyphens"
        ),
    )
    if name and name != path.parent.name:
        r.problem("name", f"{name!r} must equal the folder name {path.parent.name!r}")
    description = r.get(
        meta,
        "description",
        str,
        default=None,
        check=lambda v: None if 0 < len(v.strip()) <= 1024 else "must be 1-1024 characters",
    )
    metadata = r.get(meta, "metadata", Mapping, default={})
    version = r.get(
        metadata, "version", (str, int, float), "metadata", default=DEFAULT_SKILL_VERSION
    )
    kind = r.get(
        metadata,
        "kind",
        str,
        "metadata",
        default=DEFAULT_SKILL_KIND,
        check=lambda v: None if v in SKILL_KINDS else f"must be one of {SKILL_KINDS}",
    )
    critical = r.get(metadata, "critical-rules", list, "metadata", default=[])
    allowed = _string_list(r, meta, "allowed-tools", "")
    body = match[2] or ""
    title, intro, rule_texts = _parse_body(body, rel, problems, require_rules="kind" in metadata)
    for n in critical:
        if not isinstance(n, int) or not 1 <= n <= len(rule_texts):
            r.problem(
                "metadata.critical-rules", f"{n!r} is not a rule number (1..{len(rule_texts)})"
            )
    if None in (name, description, version, kind):
        return None
    rules = tuple(
        Rule(id=f"{name}#{i}", text=t, critical=i in critical) for i, t in enumerate(rule_texts, 1)
    )
    return Skill(
        name=name,
        description=" ".join(description.split()),
        kind=kind,
        version=str(version),
        allowed_tools=allowed,
        title=title,
        intro=intro,
        rules=rules,
        source=rel,
    )


def _load_tools(data, problems: list[Problem]):
    r = _Reader("tools.json", problems)
    servers = r.get(data, "mcp_servers", Mapping, default={}) or {}
    servers = {
        k: (v.get("description", "") if isinstance(v, Mapping) else str(v))
        for k, v in servers.items()
    }
    tools = []  # duplicates are kept here and reported by `validate`
    for i, t in enumerate(r.get(data, "tools", list) or []):
        p = f"tools[{i}]"
        name = r.get(
            t,
            "name",
            str,
            p,
            check=lambda v: (
                None if _TOOL_NAME.match(v) else "use 1-64 letters, digits, '_', '-', '.'"
            ),
        )
        fields = dict(
            description=r.get(
                t, "description", str, p, check=lambda v: None if v.strip() else "empty"
            ),
            category=r.get(
                t,
                "category",
                str,
                p,
                check=lambda v: (
                    None if v in TOOL_CATEGORIES else f"must be one of {TOOL_CATEGORIES}"
                ),
            ),
            provider=r.get(t, "provider", str, p, default="builtin"),
            version=str(r.get(t, "version", (str, int, float), p, default="1.0.0")),
            parameters=r.get(t, "parameters", Mapping, p),
            side_effects=r.get(t, "side_effects", bool, p, default=False),
            context_args=_string_list(r, t, "context_args", p),
        )
        if None not in fields.values() and name:
            tools.append(ToolSpec(name=name, source="tools.json", **fields))
    return tools, servers


def _load_prompt(data, problems: list[Problem]) -> PromptSpec | None:
    r = _Reader("prompt.yaml", problems)
    constraints, blocks = [], []
    for i, c in enumerate(r.get(data, "constraints", list, default=[])):
        p = f"constraints[{i}]"
        vals = {k: r.get(c, k, int, p) for k in ("value", "min", "max")}
        cname = r.get(c, "name", str, p)
        if None in vals.values() or cname is None:
            continue
        if not vals["min"] <= vals["value"] <= vals["max"]:
            r.problem(
                f"{p}.value",
                f"{vals['value']} is outside the valid range [{vals['min']}, {vals['max']}]",
            )
            continue
        constraints.append(
            Constraint(name=cname, description=r.get(c, "description", str, p, default=""), **vals)
        )
    for i, b in enumerate(r.get(data, "blocks", list) or []):
        p = f"blocks[{i}]"
        items = _string_list(r, b, "items", p)
        source = r.get(b, "source", str, p, default=None)
        bid, title = r.get(b, "id", str, p), r.get(b, "title", str, p)
        if bid and title is not None:
            blocks.append(
                PromptBlock(
                    id=bid,
                    title=title,
                    items=tuple(" ".join(x.split()) for x in items),
                    source=source,
                )
            )
    um = r.get(data, "user_message", Mapping)
    um_fields = (
        {k: r.get(um, k, str, "user_message") for k in ("header", "on_screen", "comment")}
        if um
        else None
    )
    name, version = r.get(data, "name", str), r.get(data, "version", (str, int, float))
    if not um_fields or None in um_fields.values() or name is None or version is None:
        return None
    return PromptSpec(
        name=name,
        version=str(version),
        blocks=tuple(blocks),
        constraints=tuple(constraints),
        user_message=UserMessageFormat(**um_fields),
        libraries=tuple(_string_list(r, data, "libraries", "")),
        source="prompt.yaml",
    )


def _load_hooks(data, problems: list[Problem]) -> HookSpec | None:
    r = _Reader("hooks.yaml", problems)
    rules = []
    for i, h in enumerate(r.get(data, "hooks", list) or []):
        p = f"hooks[{i}]"
        fields = dict(
            name=r.get(h, "name", str, p),
            point=r.get(
                h,
                "point",
                str,
                p,
                check=lambda v: None if v in HOOK_POINTS else f"must be one of {HOOK_POINTS}",
            ),
            action=r.get(
                h,
                "action",
                str,
                p,
                check=lambda v: None if v in HOOK_ACTIONS else f"must be one of {HOOK_ACTIONS}",
            ),
            message=r.get(h, "message", str, p, default=""),
            max_retries=r.get(
                h,
                "max_retries",
                int,
                p,
                default=0,
                check=lambda v: None if v >= 0 else "must be >= 0",
            ),
            enabled=r.get(h, "enabled", bool, p, default=True),
            params=r.get(h, "params", Mapping, p, default={}),
        )
        if None not in fields.values():
            rules.append(HookRule(**fields))
    fb = r.get(data, "fallback", Mapping, default={})
    fallback = Fallback(
        on_failure=r.get(
            fb,
            "on_failure",
            str,
            "fallback",
            default="conservative",
            check=lambda v: (
                None
                if v in ("conservative", "suppress")
                else "must be 'conservative' or 'suppress'"
            ),
        ),
        conservative_reply=r.get(
            fb, "conservative_reply", str, "fallback", default=Fallback().conservative_reply
        ),
        suppress_on=_string_list(r, fb, "suppress_on", "fallback"),
    )
    name, version = r.get(data, "name", str), r.get(data, "version", (str, int, float))
    envelope = r.get(data, "envelope", str, default="[{hook}] {message}")
    budget = r.get(
        data,
        "max_total_retries",
        int,
        default=3,
        check=lambda v: None if v >= 0 else "must be >= 0",
    )
    if name is None or version is None:
        return None
    return HookSpec(
        name=name,
        version=str(version),
        hooks=tuple(rules),
        libraries=tuple(_string_list(r, data, "libraries", "")),
        envelope=envelope,
        max_total_retries=budget,
        fallback=fallback,
        source="hooks.yaml",
    )


def harness_dir(directory: str | pathlib.Path) -> pathlib.Path:
    """The Harness folder: `directory` itself, or its `harness/` subfolder (a world folder)."""
    root = pathlib.Path(directory)
    if not (root / "harness.yaml").is_file() and (root / "harness" / "harness.yaml").is_file():
        root = root / "harness"
    return root


def load(directory: str | pathlib.Path) -> Harness:
    """Loads and validates a Harness directory (or a world directory holding `harness/`).

    Raises:
      HarnessError: listing every problem, each naming its file and field.
    """
    root = harness_dir(directory)
    if not root.is_dir():
        raise HarnessError([Problem(str(root), "<dir>", "not a directory")])
    problems: list[Problem] = []
    meta = _read(root, "harness.yaml", problems)
    tools, servers = _load_tools(_read(root, "tools.json", problems), problems)
    prompt = _load_prompt(_read(root, "prompt.yaml", problems), problems)
    hooks = _load_hooks(_read(root, "hooks.yaml", problems), problems)
    skills, seen = [], {}
    skill_files = sorted((root / "skills").glob("*/SKILL.md")) if (root / "skills").is_dir() else []
    if not skill_files:
        problems.append(Problem("skills/", "<dir>", "no skills/<name>/SKILL.md found"))
    for path in skill_files:
        rel = str(path.relative_to(root))
        skill = load_skill(path, rel, problems)
        if skill and skill.name in seen:
            problems.append(
                Problem(
                    rel, "name", f"duplicate Skill name {skill.name!r} (also {seen[skill.name]})"
                )
            )
        elif skill:
            seen[skill.name] = rel
            skills.append(skill)
    r = _Reader("harness.yaml", problems)
    name, release = r.get(meta, "name", str), r.get(meta, "release", (str, int, float))
    if None in (name, release, prompt, hooks):
        raise HarnessError(problems or [Problem(str(root), "<dir>", "incomplete Harness")])
    harness = Harness(
        name=name,
        release=str(release),
        skills=tuple(skills),
        tools=tuple(tools),
        prompt=prompt,
        hooks=hooks,
        mcp_servers=servers,
        description=r.get(meta, "description", str, default=""),
        source=str(root),
    )
    # Cross-module checks run even after file-level problems, so one pass reports everything.
    problems += [p for p in validate(harness) if p not in problems]
    if problems:
        raise HarnessError(problems)
    return harness


def validate(harness: Harness, renames=None) -> list[Problem]:
    """Cross-module checks; returns every problem (empty when the Harness is consistent).

    Args:
      harness: any Harness, e.g. one derived by HSA.
      renames: its `RenameMap` when names differ from canonical ones (hooks name canonical tools).
    """
    from hat_jax.harness._validate import validate_harness

    return validate_harness(harness, renames)
