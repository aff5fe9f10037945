"""Hooks: the framework that runs checks at the loop's lifecycle points from `HookSpec` data.

Each check (in `_checks.py`) is a small function `(ctx, rule, subject) -> Verdict | None`
registered under a name and a lifecycle point. The Harness decides which hooks run, in which
order, with which action (retry / modify / block / flag), wording and retry limit; `HookRunner`
applies those decisions and records a `HookEvent` for everything a hook did. Adding behaviour
means adding a check, not an `if` in the loop.

Subjects per point: `input` -> `Request`; `before_tool` -> `CallSubject` (and the
`AssistantTurn` for `well_formed_output`); `after_tool` -> `ResultSubject`; `before_reply` and
`end_of_turn` -> `ReplyCandidate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from hat_jax.harness._factcheck import Evidence
from hat_jax.harness._policy import ToolCall
from hat_jax.harness._request import Request
from hat_jax.harness._spec import HookRule, HookSpec, ToolSpec
from hat_jax.harness._state import HarnessState
from hat_jax.harness._trajectory import HookEvent


@dataclasses.dataclass(frozen=True)
class CallSubject:
    call: ToolCall
    canonical: str | None
    spec: ToolSpec | None


@dataclasses.dataclass(frozen=True)
class ResultSubject:
    call: ToolCall
    canonical: str
    result: Any
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class ReplyCandidate:
    """A reply the policy wants to give: channel public, private or none (no_reply)."""

    channel: str
    text: str
    call_id: str | None = None


@dataclasses.dataclass
class HookContext:
    """What hooks may read about the run so far."""

    state: HarnessState
    request: Request
    evidence: Evidence
    loaded_skills: list[str] = dataclasses.field(default_factory=list)
    performed: set[str] = dataclasses.field(default_factory=set)
    pending: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A violation: `detail` for logs and messages, `fields` for the message template, `fix` a
    corrected subject (used when the hook's action is `modify` or `flag`)."""

    detail: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fix: Any = None


@dataclasses.dataclass(frozen=True)
class HookImpl:
    point: str
    actions: tuple[str, ...]
    fn: Callable[[HookContext, HookRule, Any], Verdict | None]
    check_params: Callable[[Mapping[str, Any]], list[str]] | None = None
    subject: str = "default"  # "turn" for hooks that inspect a whole AssistantTurn


HOOK_IMPLEMENTATIONS: dict[str, HookImpl] = {}


def register(name: str, point: str, actions: tuple[str, ...], check_params=None, subject="default"):
    """Decorator: registers a check under `name`, run at `point`, supporting `actions`.

    `check_params(params) -> [problems]` validates the hook's parameters at load time;
    `subject="turn"` marks checks that inspect a whole `AssistantTurn`.
    """

    def register(fn):
        HOOK_IMPLEMENTATIONS[name] = HookImpl(point, actions, fn, check_params, subject)
        return fn

    return register


# ---------------------------------------------------------------------------------- runner
class _Safe(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


@dataclasses.dataclass(frozen=True)
class Violation:
    """A hook stopped the subject: `action` is retry or block; `message` goes to the policy."""

    rule: HookRule
    action: str
    detail: str
    message: str


@dataclasses.dataclass
class HookResult:
    subject: Any
    violation: Violation | None
    events: list[HookEvent]


class HookRunner:
    """Runs the enabled hooks of a `HookSpec` and keeps the retry budget of one trajectory."""

    def __init__(self, spec: HookSpec):
        self.spec = spec
        self._by_point = {
            p: spec.at(p)
            for p in ("input", "before_tool", "after_tool", "before_reply", "end_of_turn")
        }
        self._retries: dict[str, int] = {}
        self.total_retries = 0

    def run(
        self,
        point: str,
        ctx: HookContext,
        subject: Any,
        *,
        round: int,
        label: str = "",
        kind: str = "default",
    ) -> HookResult:
        """Runs the hooks of `point` whose subject kind is `kind`, in order, until one stops."""
        events: list[HookEvent] = []
        for rule in self._by_point[point]:
            impl = HOOK_IMPLEMENTATIONS[rule.name]
            if impl.subject != kind:
                continue
            verdict = impl.fn(ctx, rule, subject)
            if verdict is None:
                continue
            if rule.action in ("modify", "flag") and verdict.fix is not None:
                subject = verdict.fix
                events.append(
                    HookEvent(
                        round=round,
                        point=point,
                        hook=rule.name,
                        outcome=rule.action,
                        detail=verdict.detail,
                        subject=label,
                    )
                )
                continue
            if rule.action == "flag":
                events.append(
                    HookEvent(
                        round=round,
                        point=point,
                        hook=rule.name,
                        outcome="flag",
                        detail=verdict.detail,
                        subject=label,
                    )
                )
                continue
            action = "block" if rule.action == "block" else "retry"
            message = self.message(rule, {"detail": verdict.detail, **verdict.fields})
            events.append(
                HookEvent(
                    round=round,
                    point=point,
                    hook=rule.name,
                    outcome=action,
                    detail=verdict.detail,
                    message=message,
                    subject=label,
                )
            )
            return HookResult(subject, Violation(rule, action, verdict.detail, message), events)
        return HookResult(subject, None, events)

    def message(self, rule: HookRule, fields: Mapping[str, Any]) -> str:
        """The hook's message template, filled and wrapped in the Harness's envelope."""
        text = (rule.message or "{detail}").format_map(_Safe(fields))
        return self.spec.envelope.format_map(_Safe(hook=rule.name, message=text))

    def allow_retry(self, rule: HookRule) -> bool:
        """Consumes one retry of `rule` if both its own and the trajectory budget allow."""
        used = self._retries.get(rule.name, 0)
        if used >= rule.max_retries or self.total_retries >= self.spec.max_total_retries:
            return False
        self._retries[rule.name] = used + 1
        self.total_retries += 1
        return True


# The checks register themselves on import; importing them here keeps the registry complete for
# every user of this module.
from hat_jax.harness import _checks  # noqa: E402, F401
