"""The agent loop: one small state machine over the Harness, the policy and the tools.

    start ─► RunAgain ─► model round ─┬─► RunAgain (tool results or a hook message)
                                      ├─► Final    (a reply passed every hook)
                                      └─► Recover  (limits, retries exhausted) ─► Final

Each transition returns a typed next step. Policy calls run under the remaining trajectory
budget and tool calls under the per-call timeout (`_dispatch`); a failed or timed-out call is
an error result the policy can react to (per-call fallback). When recovery fails (rounds or
budget exhausted, hook retries used up, the policy failing twice) the Harness's fallback decides
between a conservative reply and silence (trajectory-level recovery). Behaviour lives in hooks
and Harness data, not in `if`s here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Mapping
from typing import Any

from hat_jax.harness import _dispatch
from hat_jax.harness._deadline import DeadlineExceeded, call_with_deadline, covered
from hat_jax.harness._hook_types import HookContext, ReplyCandidate, Session
from hat_jax.harness._hooks import HookRunner
from hat_jax.harness._policy import AssistantTurn, PolicyModel, SamplingParams
from hat_jax.harness._prompt import build_system_prompt, build_user_message, tool_schemas
from hat_jax.harness._request import Request
from hat_jax.harness._spec import Harness
from hat_jax.harness._state import HarnessState, as_state
from hat_jax.harness._trajectory import Fault, FinalReply, ModelCall, Trajectory


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


def run_agent(
    harness_state: HarnessState | Harness,
    request: Request,
    policy: PolicyModel,
    tools: Mapping[str, Any],
    *,
    limits: Limits | None = None,
    sampling: SamplingParams | None = None,
    session: Session | None = None,
) -> Trajectory:
    """Answers one request and returns its full trajectory.

    Args:
      harness_state: the Harness (and renames) the policy acts in.
      request: the viewer comment(s) and context.
      policy: produces one `AssistantTurn` per model round.
      tools: executors by canonical tool name (a `Toolbox`).
      limits: rounds, time budget, per-tool timeout (default `Limits()`).
      sampling: passed through to the policy (default `SamplingParams()`).
      session: the live session this request belongs to (`Session`: side-effect calls per
        viewer, for rules of the form "at most N per viewer per session"); default: a session
        of this request alone.
    """
    run = _Run(
        as_state(harness_state),
        request,
        policy,
        tools,
        limits or Limits(),
        sampling or SamplingParams(),
        session or Session(),
    )
    step = run.start()
    while isinstance(step, RunAgain):
        step = run.model_round()
    if isinstance(step, Recover):
        step = run.recover(step)
    return run.finish(step)


class _Run:
    """Mutable state of one trajectory; each public method is one transition."""

    def __init__(self, state, request, policy, tools, limits, sampling, session):
        self.state, self.request, self.policy, self.tools = state, request, policy, tools
        self.limits, self.sampling = limits, sampling
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + limits.budget_s
        self.max_rounds = min(limits.max_rounds, state.harness.prompt.constraint("max_rounds"))
        self.hooks = HookRunner(state.harness.hooks)
        self.ctx = HookContext(state=state, request=request, session=session)
        self.round, self.model_s, self.tool_s, self.policy_retried = 0, 0.0, 0.0, False
        self.messages: list[dict[str, Any]] = []
        h = state.harness
        self.traj = Trajectory(
            request={"comments": [c.to_dict() for c in request.comments]},
            harness={"name": h.name, "release": h.release, "version": h.version},
            renames=state.renames.to_dict(),
            limits={f.name: getattr(limits, f.name) for f in dataclasses.fields(limits)},
            started_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        )

    def start(self) -> RunAgain | Recover:
        res = self.hooks.run("input", self.ctx, self.request, round=0, label="request")
        self.traj.hook_events += res.events
        self.request = self.ctx.request = res.subject
        if res.violation or not self.request.comments:
            return Recover(
                "input_blocked",
                res.violation.detail if res.violation else "no comment left after normalisation",
            )
        ctx = self.request.context
        self.ctx.facts += [ctx.product, ctx.room, ctx.faq_pool]
        self.messages = [
            {"role": "system", "content": build_system_prompt(self.state, self.request)},
            {"role": "user", "content": build_user_message(self.state, self.request)},
        ]
        return RunAgain("start")

    def model_round(self) -> RunAgain | Final | Recover:
        remaining = self.deadline - time.perf_counter()
        if self.round >= self.max_rounds:
            return Recover(
                "max_rounds", f"{self.max_rounds} model rounds used without a valid reply"
            )
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
                lambda: self.policy.generate(list(self.messages), schemas, self.sampling),
                remaining,
                inline=getattr(self.policy, "inline", False),
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
        return self._act(turn)

    def _act(self, turn: AssistantTurn) -> RunAgain | Final | Recover:
        """Runs a turn's tool calls (two passes, see `_dispatch`) and checks its replies."""
        self.ctx.pending = set()
        followups: list[dict[str, Any]] = []
        res = self.hooks.run(
            "before_tool", self.ctx, turn, round=self.round, label="output", kind="turn"
        )
        self.traj.hook_events += res.events
        if v := res.violation:
            if v.action != "retry" or not self.hooks.allow_retry(v.rule):
                return Recover("retries_exhausted", v.detail, v.rule.name)
            followups.append({"role": "user", "content": v.message})
        slots, replies = [], []
        for i, call in enumerate(turn.tool_calls):
            out = (
                _dispatch.tool_message(
                    call,
                    _dispatch.error(
                        "too_many_calls",
                        f"at most {self.limits.max_calls_per_round} calls per round",
                    ),
                )
                if i >= self.limits.max_calls_per_round
                else _dispatch.dispatch(self, call)
            )
            if isinstance(out, _dispatch.Exhausted):
                return Recover("retries_exhausted", out.detail, out.hook)
            if isinstance(out, ReplyCandidate):
                replies.append((i, out))
                out = None
            slots.append(out)
        intervals: list[tuple[float, float]] = []
        slots = [
            _dispatch.collect(self, s, intervals) if isinstance(s, _dispatch.Started) else s
            for s in slots
        ]
        self.tool_s += covered(intervals)
        if not turn.tool_calls and turn.content.strip() and not turn.parse_errors:
            replies.append((None, ReplyCandidate(channel="public", text=turn.content)))
        step = (
            self._check_replies(turn, replies, slots, followups)
            if replies
            else RunAgain("tool_results")
        )
        if not isinstance(step, Final):
            self.messages += [m for m in slots if m is not None] + followups
        return step

    def _check_replies(self, turn, replies, slots, followups) -> Final | RunAgain | Recover:
        passed, failed = [], {}
        for index, cand in replies:
            res = self.hooks.run(
                "before_reply", self.ctx, cand, round=self.round, label=cand.channel
            )
            self.traj.hook_events += res.events
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
                    _dispatch.error("rejected", text)
                    if v
                    else {"status": "not_delivered", "message": text}
                )
                slots[index] = _dispatch.tool_message(turn.tool_calls[index], result)
        return RunAgain("hook_retry")

    def recover(self, step: Recover) -> Final:
        self.traj.faults.append(Fault(round=self.round, kind=step.fault, detail=step.detail))
        fallback = self.state.harness.hooks.fallback
        if fallback.on_failure == "suppress" or {step.fault, step.hook} & set(fallback.suppress_on):
            return Final((), fallback=True, end=f"suppressed:{step.fault}")
        reply = ReplyCandidate(channel="public", text=fallback.conservative_reply)
        return Final((reply,), fallback=True, end=f"fallback:{step.fault}")

    def finish(self, step: Final) -> Trajectory:
        texts: dict[str, list[str]] = {"public": [], "private": [], "none": []}
        for cand in step.replies:
            res = self.hooks.run(
                "end_of_turn", self.ctx, cand, round=self.round, label=cand.channel
            )
            self.traj.hook_events += res.events
            if res.subject.text.strip() or cand.channel == "none":
                texts[cand.channel].append(res.subject.text.strip())
        public, private = " ".join(texts["public"]) or None, " ".join(texts["private"]) or None
        total, traj = time.perf_counter() - self.t0, self.traj
        self.request = self.ctx.request  # with the flags hooks raised since the input hooks
        raw = traj.request["comments"]
        traj.request = self.request.to_dict()
        if raw != traj.request["comments"]:
            traj.request["raw_comments"] = raw
        traj.loaded_skills, traj.messages = list(self.ctx.loaded_skills), self.messages
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
