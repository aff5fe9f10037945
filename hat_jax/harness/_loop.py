"""The agent loop: one small state machine over the Harness, the policy and the tools.

    start ──► RunAgain ──► model round ──► RunAgain (tool results / hook message) ─┐
                 ▲                     ├─► Final (a reply passed every hook)         │
                 └─────────────────────┼─► Recover (limits, retries exhausted) ──► Final
                                       └───────────────────────────────────────────┘

Each step returns a typed next step. Policy calls run under the remaining trajectory budget,
tool calls under the per-call timeout; a failed or timed-out call becomes an error result the
policy can react to (per-call fallback). When recovery fails (rounds or budget exhausted, hook
retries used up, the policy failing twice) the Harness's fallback decides: a conservative reply
or silence (trajectory-level recovery). Behaviour lives in hooks and Harness data, not here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Mapping
from typing import Any

from hat_jax.harness._deadline import DeadlineExceeded, call_with_deadline
from hat_jax.harness._errors import ToolError
from hat_jax.harness._factcheck import Evidence
from hat_jax.harness._hooks import (
    CallSubject,
    HookContext,
    HookRunner,
    ReplyCandidate,
    ResultSubject,
    Violation,
)
from hat_jax.harness._policy import AssistantTurn, PolicyModel, SamplingParams, ToolCall
from hat_jax.harness._prompt import (
    build_system_prompt,
    build_user_message,
    render_skill,
    tool_schemas,
)
from hat_jax.harness._request import Request, RequestContext
from hat_jax.harness._spec import FLOW_TOOLS, LOAD_SKILL, NO_REPLY, REPLY_PUBLIC, Harness
from hat_jax.harness._state import HarnessState, as_state
from hat_jax.harness._trajectory import Fault, FinalReply, ModelCall, ToolRecord, Trajectory


@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
    """Hard limits of one trajectory (paper §6.2: 4 model rounds, 10 s, 5 s per tool call).

    The effective round limit is the smaller of `max_rounds` and the Harness's `max_rounds`
    prompt constraint, so a Harness variant that lowers it is obeyed.
    """

    max_rounds: int = 4
    budget_s: float = 10.0
    tool_timeout_s: float = 5.0
    max_calls_per_round: int = 8

    def __post_init__(self):
        for name in ("max_rounds", "budget_s", "tool_timeout_s", "max_calls_per_round"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class RunAgain:
    reason: str


@dataclasses.dataclass(frozen=True)
class Final:
    replies: tuple[ReplyCandidate, ...]
    fallback: bool = False
    end: str = "reply"


@dataclasses.dataclass(frozen=True)
class Recover:
    fault: str
    detail: str = ""
    hook: str | None = None


_HOOK_ERRORS = {"known_tool": "unknown_tool", "check_tool_arguments": "invalid_arguments"}


def run_agent(
    harness_state: HarnessState | Harness,
    request: Request,
    policy: PolicyModel,
    tools: Mapping[str, Any],
    *,
    limits: Limits | None = None,
    sampling: SamplingParams | None = None,
) -> Trajectory:
    """Answers one request and returns its full trajectory.

    Args:
      harness_state: the Harness (and renames) the policy acts in.
      request: the viewer comment(s) and context.
      policy: produces one `AssistantTurn` per model round.
      tools: executors by canonical tool name (a `Toolbox`).
      limits: rounds, time budget, per-tool timeout (default `Limits()`).
      sampling: passed through to the policy (default `SamplingParams()`).
    """
    limits, sampling = limits or Limits(), sampling or SamplingParams()
    run = _Run(as_state(harness_state), request, policy, tools, limits, sampling)
    step = run.start()
    while isinstance(step, RunAgain):
        step = run.model_round()
    if isinstance(step, Recover):
        step = run.recover(step)
    return run.finish(step)


def _context_evidence(context: RequestContext) -> Evidence:
    """Evidence of a request's context (product, room, FAQ pool), computed once per context."""
    evidence = context.__dict__.get("_evidence")
    if evidence is None:
        evidence = Evidence()
        for value in (context.product, context.room, context.faq_pool):
            evidence.add(value)
        object.__setattr__(context, "_evidence", evidence)
    return evidence


def _tool_message(call: ToolCall, result: Any) -> dict[str, Any]:
    content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


class _Run:
    """Mutable state of one trajectory; each method is one transition of the state machine."""

    def __init__(self, state, request, policy, tools, limits, sampling):
        self.state, self.request, self.policy, self.tools = state, request, policy, tools
        self.limits, self.sampling = limits, sampling
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + limits.budget_s
        self.max_rounds = min(limits.max_rounds, state.harness.prompt.constraint("max_rounds"))
        self.hooks = HookRunner(state.harness.hooks)
        self.ctx = HookContext(state=state, request=request, evidence=Evidence())
        self.round, self.model_s, self.tool_s, self.policy_retried = 0, 0.0, 0.0, False
        self.messages: list[dict[str, Any]] = []
        h = state.harness
        self.traj = Trajectory(
            request={"comments": [c.to_dict() for c in request.comments]},
            harness={"name": h.name, "release": h.release, "version": h.version},
            renames=state.renames.to_dict(),
            limits=dataclasses.asdict(limits),
            started_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        )

    def _events(self, result) -> None:
        self.traj.hook_events += result.events

    def start(self) -> RunAgain | Recover:
        res = self.hooks.run("input", self.ctx, self.request, round=0, label="request")
        self._events(res)
        self.request = self.ctx.request = res.subject
        if res.violation or not self.request.comments:
            return Recover(
                "input_blocked",
                res.violation.detail if res.violation else "no comment left after normalisation",
            )
        self.ctx.evidence.merge(_context_evidence(self.request.context))
        self.messages = [
            {"role": "system", "content": build_system_prompt(self.state, self.request)},
            {"role": "user", "content": build_user_message(self.state, self.request)},
        ]
        return RunAgain("start")

    def model_round(self) -> RunAgain | Final | Recover:
        if self.round >= self.max_rounds:
            return Recover(
                "max_rounds", f"{self.max_rounds} model rounds used without a valid reply"
            )
        remaining = self.deadline - time.perf_counter()
        if remaining <= 0:
            return Recover("budget", f"trajectory budget of {self.limits.budget_s} s spent")
        self.round += 1
        record = ModelCall(
            round=self.round,
            messages=list(self.messages),
            tools=list(self.state.harness.tool_names),
            started_s=time.perf_counter() - self.t0,
        )
        self.traj.model_calls.append(record)
        schemas = tool_schemas(self.state)
        try:
            turn, record.elapsed_s = call_with_deadline(
                lambda: self.policy.generate(list(self.messages), schemas, self.sampling), remaining
            )
            if not isinstance(turn, AssistantTurn):
                raise TypeError(f"policy returned {type(turn).__name__}, not AssistantTurn")
        except DeadlineExceeded:
            record.error, record.elapsed_s = "timeout", remaining
            self.model_s += remaining
            return Recover(
                "policy_timeout", f"no policy output within the remaining {remaining:.2f} s"
            )
        except Exception as err:  # noqa: BLE001 - any policy failure is a recorded fault
            record.error = f"{type(err).__name__}: {err}"[:500]
            self.traj.faults.append(
                Fault(round=self.round, kind="policy_error", detail=record.error)
            )
            if self.policy_retried:
                return Recover("policy_error", record.error)
            self.policy_retried = True
            return RunAgain("policy_retry")
        self.model_s += record.elapsed_s
        record.output = turn.to_dict()
        self.messages.append(turn.to_message())
        return self._handle_turn(turn)

    def _handle_turn(self, turn: AssistantTurn) -> RunAgain | Final | Recover:
        self.ctx.pending = set()
        followups: list[dict[str, Any]] = []
        res = self.hooks.run(
            "before_tool", self.ctx, turn, round=self.round, label="output", kind="turn"
        )
        self._events(res)
        if res.violation:
            if not self._may_continue(res.violation):
                return Recover("retries_exhausted", res.violation.detail, res.violation.rule.name)
            followups.append({"role": "user", "content": res.violation.message})
        slots: list[dict[str, Any] | None] = []
        replies: list[tuple[int | None, ReplyCandidate]] = []
        for i, call in enumerate(turn.tool_calls):
            if i >= self.limits.max_calls_per_round:
                slots.append(
                    _tool_message(
                        call,
                        _error(
                            "too_many_calls",
                            f"at most {self.limits.max_calls_per_round} calls per round",
                        ),
                    )
                )
                continue
            out = self._tool_call(call)
            if isinstance(out, Recover):
                return out
            if isinstance(out, ReplyCandidate):
                replies.append((i, out))
                out = None
            slots.append(out)
        if not turn.tool_calls and turn.content.strip() and not turn.parse_errors:
            replies.append((None, ReplyCandidate(channel="public", text=turn.content)))
        step: RunAgain | Final | Recover = RunAgain("tool_results")
        if replies:
            step = self._check_replies(turn.tool_calls, replies, slots, followups)
        if not isinstance(step, Final):
            self.messages += [m for m in slots if m is not None] + followups
        return step

    def _may_continue(self, violation: Violation) -> bool:
        return violation.action == "retry" and self.hooks.allow_retry(violation.rule)

    def _tool_call(self, call: ToolCall) -> dict[str, Any] | ReplyCandidate | Recover:
        canonical = self.state.resolve_tool(call.name)
        spec = self.state.harness.tool(call.name) if canonical else None
        args = dict(call.arguments) if isinstance(call.arguments, Mapping) else call.arguments
        rec = ToolRecord(
            round=self.round,
            call_id=call.id,
            name=call.name,
            canonical=canonical,
            arguments=args,
            started_s=time.perf_counter() - self.t0,
        )
        self.traj.tool_calls.append(rec)
        res = self.hooks.run(
            "before_tool",
            self.ctx,
            CallSubject(call, canonical, spec),
            round=self.round,
            label=call.name,
        )
        self._events(res)
        if v := res.violation:
            rec.error = _HOOK_ERRORS.get(v.rule.name, "not_allowed")
            rec.result = _error(rec.error, v.message)
            if v.action == "retry" and not self.hooks.allow_retry(v.rule):
                return Recover("retries_exhausted", v.detail, v.rule.name)
            return _tool_message(call, rec.result)
        if canonical in FLOW_TOOLS:
            return self._flow(call, canonical, rec)
        return self._execute(call, canonical, spec, rec)

    def _flow(
        self, call: ToolCall, canonical: str, rec: ToolRecord
    ) -> dict[str, Any] | ReplyCandidate:
        args = call.arguments if isinstance(call.arguments, Mapping) else {}
        if canonical == LOAD_SKILL:
            skill = self.state.harness.skill(str(args.get("name", "")))
            if skill is None:
                rec.error = "tool_error"
                rec.result = _error(
                    "unknown_skill",
                    f"There is no Skill named {args.get('name')!r}; "
                    f"Skills: {', '.join(self.state.harness.skill_names)}.",
                )
            else:
                if skill.name not in self.ctx.loaded_skills:
                    self.ctx.loaded_skills.append(skill.name)
                rec.result = render_skill(self.state, skill)
            return _tool_message(call, rec.result)
        self.ctx.pending.add(canonical)
        if canonical == NO_REPLY:
            return ReplyCandidate(channel="none", text=str(args.get("reason", "")), call_id=call.id)
        channel = "public" if canonical == REPLY_PUBLIC else "private"
        return ReplyCandidate(channel=channel, text=str(args.get("text", "")), call_id=call.id)

    def _execute(self, call: ToolCall, canonical: str, spec, rec: ToolRecord) -> dict[str, Any]:
        fn = self.tools.get(canonical)
        if fn is None:
            rec.error, rec.result = (
                "no_executor",
                _error("unavailable", f"{call.name} is unavailable right now"),
            )
            self.traj.faults.append(Fault(round=self.round, kind="no_executor", detail=canonical))
            return _tool_message(call, rec.result)
        context = self.request.tool_context()
        given = call.arguments if isinstance(call.arguments, Mapping) else {}
        args = {**given, **{k: context[k] for k in spec.context_args}}
        rec.injected = list(spec.context_args)
        timeout = max(0.0, min(self.limits.tool_timeout_s, self.deadline - time.perf_counter()))
        error = None
        try:
            value, elapsed = call_with_deadline(lambda: fn(args), timeout)
        except DeadlineExceeded:
            error, elapsed = "timeout", timeout
            value = _error(
                "timeout",
                f"{call.name} did not answer within {timeout:.1f} s; try again or answer without it",
            )
            self.traj.faults.append(Fault(round=self.round, kind="tool_timeout", detail=call.name))
        except ToolError as err:
            error, elapsed, value = err.kind, 0.0, _error(err.kind, str(err))
            if err.kind == "timeout":
                self.traj.faults.append(
                    Fault(round=self.round, kind="tool_timeout", detail=call.name)
                )
        except Exception as err:  # noqa: BLE001 - a crashing executor must not crash the loop
            error, elapsed, value = (
                "exception",
                0.0,
                _error("tool_failed", f"{call.name} failed unexpectedly"),
            )
            self.traj.faults.append(
                Fault(
                    round=self.round,
                    kind="tool_exception",
                    detail=f"{call.name}: {type(err).__name__}: {err}"[:300],
                )
            )
        self.tool_s += elapsed
        res = self.hooks.run(
            "after_tool",
            self.ctx,
            ResultSubject(call, canonical, value, error),
            round=self.round,
            label=call.name,
        )
        self._events(res)
        value, error = res.subject.result, res.subject.error
        if error == "malformed":
            self.traj.faults.append(
                Fault(round=self.round, kind="malformed_result", detail=call.name)
            )
        if error is None:
            self.ctx.evidence.add(value)
            self.ctx.performed.add(canonical)
        rec.result, rec.error, rec.elapsed_s = value, error, elapsed
        return _tool_message(call, value)

    def _check_replies(self, calls, replies, slots, followups) -> Final | RunAgain | Recover:
        passed, failed = [], {}
        for index, cand in replies:
            res = self.hooks.run(
                "before_reply", self.ctx, cand, round=self.round, label=cand.channel
            )
            self._events(res)
            if res.violation:
                failed[index] = res.violation
            else:
                passed.append(res.subject)
        if not failed:
            return Final(
                tuple(passed),
                end="no_reply" if all(c.channel == "none" for c in passed) else "reply",
            )
        for v in failed.values():
            if v.action == "block":
                return Recover("reply_blocked", v.detail, v.rule.name)
            if not self.hooks.allow_retry(v.rule):
                return Recover("retries_exhausted", v.detail, v.rule.name)
        for index, _ in replies:
            v = failed.get(index)
            text = (
                v.message
                if v
                else "Not delivered: fix the other reply of this turn and send both again."
            )
            if index is None:
                followups.append({"role": "user", "content": text})
            else:
                result = (
                    _error("rejected", text) if v else {"status": "not_delivered", "message": text}
                )
                slots[index] = _tool_message(calls[index], result)
        return RunAgain("hook_retry")

    def recover(self, step: Recover) -> Final:
        self.traj.faults.append(Fault(round=self.round, kind=step.fault, detail=step.detail))
        fallback = self.state.harness.hooks.fallback
        reasons = {step.fault, step.hook}
        if fallback.on_failure == "suppress" or reasons & set(fallback.suppress_on):
            return Final((), fallback=True, end=f"suppressed:{step.fault}")
        return Final(
            (ReplyCandidate(channel="public", text=fallback.conservative_reply),),
            fallback=True,
            end=f"fallback:{step.fault}",
        )

    def finish(self, step: Final) -> Trajectory:
        texts: dict[str, list[str]] = {"public": [], "private": [], "none": []}
        for cand in step.replies:
            res = self.hooks.run(
                "end_of_turn", self.ctx, cand, round=self.round, label=cand.channel
            )
            self._events(res)
            if res.subject.text.strip() or cand.channel == "none":
                texts[cand.channel].append(res.subject.text.strip())
        public, private = " ".join(texts["public"]) or None, " ".join(texts["private"]) or None
        total = time.perf_counter() - self.t0
        traj = self.traj
        raw = traj.request["comments"]
        traj.request = self.request.to_dict()
        if raw != traj.request["comments"]:
            traj.request["raw_comments"] = raw
        traj.loaded_skills = list(self.ctx.loaded_skills)
        traj.messages = self.messages
        traj.final = FinalReply(
            public=public,
            private=private,
            private_to=self.request.viewer_id if private else None,
            no_reply_reason=(" ".join(texts["none"]) or None) if texts["none"] else None,
            suppressed=public is None and private is None,
            fallback=step.fallback,
            end=step.end,
        )
        traj.timings = {
            "total_s": total,
            "model_s": self.model_s,
            "tool_s": self.tool_s,
            "overhead_s": max(0.0, total - self.model_s - self.tool_s),
            "rounds": self.round,
        }
        return traj
