"""Hooks: the runner that applies a `HookSpec`'s decisions to the checks it names.

Each check is a small function `(ctx, rule, subject) -> Verdict | None` in a `CheckLibrary`:
the runtime's own (`_checks.RUNTIME_CHECKS`) and those a Harness names in hooks.yaml's
`libraries` (modules exposing a `CHECKS` library, imported by name when the Harness is
validated or run). The Harness decides which hooks run, in which order, with which action
(retry / modify / block / flag), wording and retry limit; `HookRunner` applies those decisions
and records a `HookEvent` for everything a hook did. Adding behaviour means adding a check, not
an `if` in the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hat_jax.harness._checks import RUNTIME_CHECKS
from hat_jax.harness._hook_types import CheckLibrary, HookContext, HookImpl, _Safe
from hat_jax.harness._libraries import combined
from hat_jax.harness._spec import HookRule, HookSpec
from hat_jax.harness._trajectory import HookEvent


def checks_for(spec: HookSpec) -> Mapping[str, HookImpl]:
    """Every check a Harness's hooks may name: the runtime's, then its declared libraries'
    (`LibraryError` when one cannot be used)."""
    return combined(RUNTIME_CHECKS, spec.libraries, "CHECKS", CheckLibrary)


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
        self.checks = checks_for(spec)
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
            impl = self.checks[rule.name]
            if impl.subject != kind:
                continue
            verdict = impl.fn(ctx, rule, subject)
            if verdict is None:
                continue
            if rule.action in ("modify", "flag") and verdict.fix is not None:
                subject = verdict.fix
                if verdict.flags:
                    flags = tuple(dict.fromkeys((*ctx.request.flags, *verdict.flags)))
                    ctx.request = dataclasses.replace(ctx.request, flags=flags)
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
