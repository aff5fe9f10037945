"""`Trajectory`: the complete, JSON-serialisable record of one agent run, and JSONL I/O.

A trajectory keeps everything needed to inspect, score or train on a run: the request, the
Harness version and renames, every model call with the exact messages it saw and what it
produced (reasoning, tool calls, token ids / log-probs when known), every tool call and its
result, every hook event, faults, timings and the final reply. Files are written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

from hat_jax import files

SCHEMA_VERSION = 1


@dataclasses.dataclass(kw_only=True)
class HookEvent:
    """A hook that did something: `outcome` is modify, flag, retry or block."""

    round: int
    point: str
    hook: str
    outcome: str
    detail: str = ""
    message: str = ""
    subject: str = ""


@dataclasses.dataclass(kw_only=True)
class ToolRecord:
    """One tool call: surface and canonical name, arguments, result or error, timing.

    `error` is None on success, else one of unknown_tool, invalid_arguments, not_allowed,
    timeout, tool_error, denied, exception, malformed, no_executor.
    """

    round: int
    call_id: str
    name: str
    canonical: str | None
    arguments: Any
    injected: list[str] = dataclasses.field(default_factory=list)
    result: Any = None
    error: str | None = None
    started_s: float = 0.0
    elapsed_s: float = 0.0


@dataclasses.dataclass(kw_only=True)
class ModelCall:
    """One policy call: the messages it saw, what it returned (`AssistantTurn.to_dict()`)."""

    round: int
    messages: list[dict[str, Any]]
    tools: list[str]
    output: dict[str, Any] | None = None
    error: str | None = None
    started_s: float = 0.0
    elapsed_s: float = 0.0


@dataclasses.dataclass(kw_only=True)
class Fault:
    """Something that went wrong: policy_timeout, policy_error, tool_timeout, tool_exception,
    malformed_result, max_rounds, budget, retries_exhausted, reply_blocked, input_blocked."""

    round: int
    kind: str
    detail: str = ""


@dataclasses.dataclass(kw_only=True)
class FinalReply:
    """How the run ended. `public` is spoken to the room (reasoning stripped), `private` goes
    to `private_to` only; `suppressed` means nothing was said; `fallback` marks a conservative
    reply produced by recovery instead of the policy."""

    public: str | None = None
    private: str | None = None
    private_to: str | None = None
    no_reply_reason: str | None = None
    suppressed: bool = False
    fallback: bool = False
    end: str = ""


@dataclasses.dataclass(kw_only=True)
class Trajectory:
    """The structured record of one `run_agent` call."""

    request: dict[str, Any]
    harness: dict[str, str]
    renames: dict[str, dict[str, str]]
    limits: dict[str, Any]
    model_calls: list[ModelCall] = dataclasses.field(default_factory=list)
    tool_calls: list[ToolRecord] = dataclasses.field(default_factory=list)
    hook_events: list[HookEvent] = dataclasses.field(default_factory=list)
    faults: list[Fault] = dataclasses.field(default_factory=list)
    loaded_skills: list[str] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    final: FinalReply = dataclasses.field(default_factory=FinalReply)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    started_at: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def spoken(self) -> str | None:
        """What the avatar says aloud (None when suppressed or private only)."""
        return self.final.public

    @property
    def rounds(self) -> int:
        return len(self.model_calls)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, default=_json_default)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"trajectory schema_version {version!r} is not {SCHEMA_VERSION}")
        d = dict(data)
        d["model_calls"] = [ModelCall(**x) for x in d.get("model_calls", [])]
        d["tool_calls"] = [ToolRecord(**x) for x in d.get("tool_calls", [])]
        d["hook_events"] = [HookEvent(**x) for x in d.get("hook_events", [])]
        d["faults"] = [Fault(**x) for x in d.get("faults", [])]
        d["final"] = FinalReply(**d.get("final", {}))
        return cls(**d)


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return repr(value)


def write_trajectories(
    path: str | os.PathLike, trajectories: Iterable[Trajectory], *, append: bool = False
) -> pathlib.Path:
    """Writes trajectories as JSONL, atomically (temp file + `os.replace`).

    With `append=True` the existing lines are kept and the new ones added after them; the file
    is still replaced in one step, so readers never see a partial line.
    """
    # Lone surrogates (possible in raw viewer text) are written as escapes by `write_jsonl`.
    return files.write_jsonl(path, (t.to_json() for t in trajectories), append=append)


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """Reads a JSONL file written by `write_trajectories` (errors name the line)."""
    return files.read_jsonl(path, Trajectory.from_dict, what="trajectory")
