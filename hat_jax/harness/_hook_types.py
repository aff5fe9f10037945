"""The vocabulary of hook checks: their subjects, the context they read, their verdicts, and
`CheckLibrary`, the named set a module of checks builds.

Subjects per point: `input` -> `Request`; `before_tool` -> `CallSubject` (and the
`AssistantTurn` for `well_formed_output`); `after_tool` -> `ResultSubject`; `before_reply` and
`end_of_turn` -> `ReplyCandidate`.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from hat_jax.harness._libraries import NamedSet
from hat_jax.harness._policy import ToolCall
from hat_jax.harness._request import Request
from hat_jax.harness._spec import HookRule, ToolSpec
from hat_jax.harness._state import HarnessState


class _Safe(dict):
    """`str.format_map` mapping that leaves unknown `{placeholders}` as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


@dataclasses.dataclass(frozen=True)
class CallSubject:
    call: ToolCall
    canonical: str | None
    spec: ToolSpec | None


@dataclasses.dataclass(frozen=True)
class ResultSubject:
    """A tool result. `tainted`: a hook withheld part of it as instructions, so none of it is
    evidence (it still reaches the policy, withheld parts replaced)."""

    call: ToolCall
    canonical: str
    result: Any
    error: str | None = None
    tainted: bool = False


@dataclasses.dataclass(frozen=True)
class ReplyCandidate:
    """A reply the policy wants to give: channel public, private or none (no_reply)."""

    channel: str
    text: str
    call_id: str | None = None


class Session:
    """The side-effect calls of one live session, per viewer and canonical tool: what a rule of
    the form "at most N per viewer per session" counts (`params.side_effects.<tool>.
    max_per_viewer`). A call counts from the moment it starts, and stops counting if it fails
    (as `HookContext.calls`), so a retry after a failure is allowed. Pass one `Session` to every
    `run_agent` call of a session (`launch.agent` keeps one per run); without one, the request
    is its own session. Safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def count(self, viewer_id: str, tool: str) -> int:
        """Calls of canonical `tool` for `viewer_id` started so far that did not fail."""
        with self._lock:
            return self._calls[viewer_id, tool]

    def add(self, viewer_id: str, tool: str, n: int = 1) -> None:
        """Counts `n` more started calls (a negative `n` takes back failed ones)."""
        with self._lock:
            self._calls[viewer_id, tool] += n
            if self._calls[viewer_id, tool] <= 0:
                del self._calls[viewer_id, tool]

    def to_dict(self) -> dict[str, dict[str, int]]:
        """`{viewer_id: {tool: calls}}`."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (viewer, tool), n in sorted(self._calls.items()):
                out.setdefault(viewer, {})[tool] = n
        return out


@dataclasses.dataclass
class HookContext:
    """What hooks may read about the run so far.

    `facts` is what the request legitimately knows, in arrival order: the values of the request
    context the prompt showed (product, FAQ pool, room), then every successful tool result that
    no hook found tainted.
    Viewer comments and earlier replies are not facts. `calls` counts the executor calls of each
    canonical tool that were started and did not fail (so far or still running): what a rule of
    the form "at most N per request" counts, retries after failures not included; `session`
    counts the side-effect calls of the whole session per viewer (`Session`). `memo` is scratch
    space for checks that derive something from the facts once per run (keys are the check
    library's own).
    """

    state: HarnessState
    request: Request
    facts: list[Any] = dataclasses.field(default_factory=list)
    loaded_skills: list[str] = dataclasses.field(default_factory=list)
    performed: set[str] = dataclasses.field(default_factory=set)
    pending: set[str] = dataclasses.field(default_factory=set)
    calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    session: Session = dataclasses.field(default_factory=Session)
    memo: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A violation: `detail` for logs and messages, `fields` for the message template, `fix` a
    corrected subject (used when the hook's action is `modify` or `flag`), `flags` added to the
    request when the fix is applied (e.g. a tool output that taints the request)."""

    detail: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fix: Any = None
    flags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class HookImpl:
    point: str
    actions: tuple[str, ...]
    fn: Callable[[HookContext, HookRule, Any], Verdict | None]
    check_params: Callable[[Mapping[str, Any]], list[str]] | None = None
    subject: str = "default"  # "turn" for hooks that inspect a whole AssistantTurn


class CheckLibrary(NamedSet[HookImpl]):
    """A named, read-only set of hook checks: hook name -> `HookImpl`.

    A module that provides checks builds one library and adds its functions with the `check`
    decorator; nothing outside the module is modified. The runtime's own checks are
    `hat_jax.harness.RUNTIME_CHECKS`; a Harness names further libraries (modules exposing a
    `CHECKS` library) in hooks.yaml's `libraries`, e.g. the live room's commerce checks.
    """

    def check(
        self,
        name: str,
        point: str,
        actions: tuple[str, ...],
        check_params: Callable[[Mapping[str, Any]], list[str]] | None = None,
        subject: str = "default",
    ):
        """Decorator: adds a check under `name`, run at `point`, supporting `actions`.

        `check_params(params) -> [problems]` validates the hook's parameters at load time;
        `subject="turn"` marks checks that inspect a whole `AssistantTurn`.
        """

        def add(fn):
            self._add(name, HookImpl(point, actions, fn, check_params, subject))
            return fn

        return add
