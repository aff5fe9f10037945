"""The Harness as an immutable dataclass tree: Skills, tools, the prompt pipeline and Hooks.

Everything an operator edits weekly lives here as data, so Harness-State Augmentation can derive
variants with `dataclasses.replace` and the runtime reads wording, retry limits and numeric
constraints at run time. Within one Harness, modules refer to each other by the names of that
Harness (its *surface* names); `RenameMap` (in `_state.py`) maps them back to canonical names
for executors and rewards. Parsing files into this tree is `_loader.py`'s job.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from hat_jax.harness._frozen import FrozenDict, content_hash, freeze

SKILL_KINDS = ("reply", "strategy")
TOOL_CATEGORIES = ("retrieval", "commerce", "flow", "marketing")
HOOK_POINTS = ("input", "before_tool", "after_tool", "before_reply", "end_of_turn")
HOOK_ACTIONS = ("retry", "modify", "block", "flag")
RUNTIME_SOURCES = ("skills", "faqs", "history")  # prompt block sources the runtime fills itself
# Arguments the runtime fills from the request; the policy never sees or sets them.
CONTEXT_ARGS = ("viewer_id", "room_id", "now")
# Canonical names of the flow-control tools the agent loop interprets itself.
LOAD_SKILL, REPLY_PUBLIC, REPLY_PRIVATE, NO_REPLY = (
    "load_skill",
    "reply_public",
    "reply_private",
    "no_reply",
)
FLOW_TOOLS = (LOAD_SKILL, REPLY_PUBLIC, REPLY_PRIVATE, NO_REPLY)


def _no_hash(**kwargs) -> Any:
    """A field that is kept out of content hashes and equality (e.g. where it was loaded from)."""
    return dataclasses.field(compare=False, metadata={"hash": False}, **kwargs)


def to_data(obj: Any) -> Any:
    """Plain JSON data of a spec object, without fields marked `hash: False`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_data(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.metadata.get("hash", True)
        }
    if isinstance(obj, Mapping):
        return {str(k): to_data(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_data(v) for v in obj]
    return obj


class _Hashed:
    """Mixin: a content digest over `to_data(self)`, cached, and `__hash__` from it."""

    @functools.cached_property
    def digest(self) -> str:
        return content_hash(to_data(self))

    def __hash__(self) -> int:
        return hash(self.digest)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class Rule(_Hashed):
    """One numbered rule of a Skill. `id` stays stable when HSA paraphrases or reorders rules."""

    id: str
    text: str
    critical: bool = False

    __hash__ = _Hashed.__hash__


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class Skill(_Hashed):
    """An Agent-Skills module: YAML metadata plus a body of numbered rules.

    Attributes:
      name: lowercase letters, digits and hyphens; equals its folder name on disk.
      description: what the Skill does and when to load it (shown in the Skill index).
      kind: "reply" (shapes the final answer) or "strategy" (adds a tool chain).
      version: the module version recorded in the release manifest.
      allowed_tools: tools (names of this Harness) the Skill authorises once loaded.
      title: the Markdown heading of the body.
      intro: text between the heading and the first rule.
      rules: the numbered rules, in order.
      source: the file it came from (not part of the content hash).
    """

    name: str
    description: str
    kind: str
    version: str
    allowed_tools: tuple[str, ...] = ()
    title: str = ""
    intro: str = ""
    rules: tuple[Rule, ...] = ()
    source: str = _no_hash(default="")

    __hash__ = _Hashed.__hash__


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class ToolSpec(_Hashed):
    """One tool of the registry, as the policy sees it (an OpenAI function schema) plus runtime
    attributes.

    Attributes:
      name: the name the policy calls.
      description: what the tool does, shown to the policy.
      category: retrieval, commerce, flow or marketing; commerce and marketing are gated by Skills.
      provider: "builtin" or "mcp:<server>" (discovered from that MCP server at start-up).
      version: module version for the manifest.
      parameters: JSON Schema of the arguments the policy passes.
      side_effects: whether a call changes state outside the conversation (coupons, gifts).
      context_args: arguments the runtime injects from the request (see `CONTEXT_ARGS`).
    """

    name: str
    description: str
    category: str
    provider: str = "builtin"
    version: str = "1.0.0"
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)
    side_effects: bool = False
    context_args: tuple[str, ...] = ()
    source: str = _no_hash(default="")

    __hash__ = _Hashed.__hash__

    def __post_init__(self):
        object.__setattr__(self, "parameters", freeze(self.parameters))
        object.__setattr__(self, "context_args", tuple(self.context_args))

    def openai_schema(self) -> dict[str, Any]:
        """The `{"type": "function", "function": {...}}` entry for a chat-completions request."""
        from hat_jax.harness._frozen import thaw

        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": thaw(self.parameters),
            },
        }


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class Constraint(_Hashed):
    """A numeric constraint of the prompt (reply length, rounds, ...) with its valid range."""

    name: str
    value: int
    min: int
    max: int
    description: str = ""

    __hash__ = _Hashed.__hash__

    def __post_init__(self):
        if not self.min <= self.value <= self.max:
            raise ValueError(
                f"constraint {self.name}: value {self.value} outside [{self.min}, {self.max}]"
            )


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class PromptBlock(_Hashed):
    """A top-level block of the system prompt: static `items`, then items from `source`."""

    id: str
    title: str
    items: tuple[str, ...] = ()
    source: str | None = None

    __hash__ = _Hashed.__hash__


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class UserMessageFormat(_Hashed):
    """Templates of the user turn that carries the viewer comments."""

    header: str
    on_screen: str
    comment: str

    __hash__ = _Hashed.__hash__


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class PromptSpec(_Hashed):
    """The system-prompt pipeline: ordered blocks and the numeric constraints they mention."""

    name: str
    version: str
    blocks: tuple[PromptBlock, ...]
    constraints: tuple[Constraint, ...]
    user_message: UserMessageFormat
    libraries: tuple[str, ...] = ()  # modules whose `BLOCKS` fill further block sources
    source: str = _no_hash(default="")

    __hash__ = _Hashed.__hash__

    def constraint(self, name: str) -> int:
        """The current value of constraint `name` (KeyError naming it if absent)."""
        for c in self.constraints:
            if c.name == name:
                return c.value
        raise KeyError(f"prompt has no numeric constraint {name!r}")

    def with_constraint(self, name: str, value: int) -> PromptSpec:
        """A copy with constraint `name` set to `value` (which must lie in its valid range)."""
        self.constraint(name)
        new = tuple(
            dataclasses.replace(c, value=value) if c.name == name else c for c in self.constraints
        )
        return dataclasses.replace(self, constraints=new)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class HookRule(_Hashed):
    """Configuration of one hook: where it runs, what a violation does, what the policy is told.

    `name` selects the check (the runtime's or one of `HookSpec.libraries`'); `message` is a template with
    `{placeholders}` the implementation fills; `max_retries` bounds `retry` actions of this hook.
    """

    name: str
    point: str
    action: str
    message: str = ""
    max_retries: int = 0
    enabled: bool = True
    params: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)

    __hash__ = _Hashed.__hash__

    def __post_init__(self):
        object.__setattr__(self, "params", freeze(self.params))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class Fallback(_Hashed):
    """What the loop does when recovery fails: a conservative reply or silence."""

    on_failure: str = "conservative"
    conservative_reply: str = "Thanks for your question! Our team will follow up shortly."
    suppress_on: tuple[str, ...] = ()

    __hash__ = _Hashed.__hash__


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class HookSpec(_Hashed):
    """All hooks, in execution order per point, plus retry budget, message envelope, fallback."""

    name: str
    version: str
    hooks: tuple[HookRule, ...]
    libraries: tuple[str, ...] = ()  # modules whose `CHECKS` add to the runtime's checks
    envelope: str = "[{hook}] {message}"
    max_total_retries: int = 3
    fallback: Fallback = dataclasses.field(default_factory=Fallback)
    source: str = _no_hash(default="")

    __hash__ = _Hashed.__hash__

    def rule(self, name: str) -> HookRule | None:
        return next((h for h in self.hooks if h.name == name), None)

    def at(self, point: str) -> tuple[HookRule, ...]:
        """Enabled hooks of one lifecycle point, in order."""
        return tuple(h for h in self.hooks if h.point == point and h.enabled)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModuleEntry:
    """One row of a manifest: a versioned module and the hash of its content."""

    kind: str
    name: str
    version: str
    hash: str


@dataclasses.dataclass(frozen=True, kw_only=True, eq=True)
class Harness(_Hashed):
    """A complete, frozen Harness. `version` is a content hash: any edit changes it.

    Build one with `load(dir)`; derive variants with `dataclasses.replace` (or the rename
    helpers of `HarnessState`) and re-check them with `validate`.
    """

    name: str
    release: str
    skills: tuple[Skill, ...]
    tools: tuple[ToolSpec, ...]
    prompt: PromptSpec
    hooks: HookSpec
    mcp_servers: Mapping[str, str] = dataclasses.field(default_factory=FrozenDict)
    description: str = ""
    source: str = _no_hash(default="")

    __hash__ = _Hashed.__hash__

    def __post_init__(self):
        object.__setattr__(self, "mcp_servers", freeze(self.mcp_servers))
        object.__setattr__(self, "_skills", {s.name: s for s in self.skills})
        object.__setattr__(self, "_tools", {t.name: t for t in self.tools})

    @property
    def version(self) -> str:
        """The content hash (16 hex digits) that identifies this exact Harness."""
        return self.digest[:16]

    def skill(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def tool(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    @property
    def skill_names(self) -> tuple[str, ...]:
        return tuple(self._skills)

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def manifest(self) -> tuple[ModuleEntry, ...]:
        """Every module (Skills, tools, prompt pipeline, hooks) with its version and hash."""
        rows = [
            ModuleEntry(kind="skill", name=s.name, version=s.version, hash=s.digest)
            for s in self.skills
        ]
        rows += [
            ModuleEntry(kind="tool", name=t.name, version=t.version, hash=t.digest)
            for t in self.tools
        ]
        rows.append(
            ModuleEntry(
                kind="prompt",
                name=self.prompt.name,
                version=self.prompt.version,
                hash=self.prompt.digest,
            )
        )
        rows.append(
            ModuleEntry(
                kind="hooks",
                name=self.hooks.name,
                version=self.hooks.version,
                hash=self.hooks.digest,
            )
        )
        return tuple(rows)
