"""Tool-call dispatch for the agent loop: checks, flow-control tools, executors, results.

One round's calls are handled in two passes. `dispatch` runs the before-tool hooks in call
order (so a `load_skill` early in the turn authorises a commerce call later in it), answers
flow-control tools itself and starts executor calls on worker threads. `collect` then waits for
each started call until its own deadline (min of the per-call timeout and the trajectory
budget), maps failures to error results, runs the after-tool hooks and adds successful results
that carried no instructions (not `tainted`) to the run's facts. Independent calls of one round therefore run in parallel.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from hat_jax.harness._deadline import Completed, DeadlineExceeded, Pending, start
from hat_jax.harness._errors import ToolError
from hat_jax.harness._hook_types import CallSubject, ReplyCandidate, ResultSubject
from hat_jax.harness._policy import ToolCall
from hat_jax.harness._prompt import render_skill
from hat_jax.harness._spec import FLOW_TOOLS, LOAD_SKILL, NO_REPLY, REPLY_PUBLIC, ToolSpec
from hat_jax.harness._trajectory import Fault, ToolRecord

_HOOK_ERRORS = {"known_tool": "unknown_tool", "check_tool_arguments": "invalid_arguments"}


@dataclasses.dataclass
class Started:
    """An executor call in flight."""

    call: ToolCall
    canonical: str
    rec: ToolRecord
    pending: Pending | Completed
    deadline: float
    timeout: float
    side_effects: bool = False  # counted in the session while it has not failed


@dataclasses.dataclass(frozen=True)
class Exhausted:
    """A hook's retries are used up: the loop must recover."""

    detail: str
    hook: str


def tool_message(call: ToolCall, result: Any) -> dict[str, Any]:
    content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def dispatch(run, call: ToolCall) -> dict[str, Any] | ReplyCandidate | Started | Exhausted:
    """First pass over one call: hooks, then a flow-control answer or a started executor."""
    canonical = run.state.resolve_tool(call.name)
    spec = run.state.harness.tool(call.name) if canonical else None
    args = dict(call.arguments) if isinstance(call.arguments, Mapping) else call.arguments
    rec = ToolRecord(
        round=run.round,
        call_id=call.id,
        name=call.name,
        canonical=canonical,
        arguments=args,
        started_s=time.perf_counter() - run.t0,
    )
    run.traj.tool_calls.append(rec)
    res = run.hooks.run(
        "before_tool", run.ctx, CallSubject(call, canonical, spec), round=run.round, label=call.name
    )
    run.traj.hook_events += res.events
    if v := res.violation:
        rec.error = _HOOK_ERRORS.get(v.rule.name, "not_allowed")
        rec.result = error(rec.error, v.message)
        if v.action == "retry" and not run.hooks.allow_retry(v.rule):
            return Exhausted(v.detail, v.rule.name)
        return tool_message(call, rec.result)
    if canonical in FLOW_TOOLS:
        return _flow(run, call, canonical, rec)
    return _start(run, call, canonical, spec, rec)


def _flow(run, call: ToolCall, canonical: str, rec: ToolRecord) -> dict[str, Any] | ReplyCandidate:
    args = call.arguments if isinstance(call.arguments, Mapping) else {}
    if canonical == LOAD_SKILL:
        skill = run.state.harness.skill(str(args.get("name", "")))
        if skill is None:
            rec.error = "tool_error"
            names = ", ".join(run.state.harness.skill_names)
            rec.result = error(
                "unknown_skill", f"There is no Skill named {args.get('name')!r}; Skills: {names}."
            )
        else:
            if skill.name not in run.ctx.loaded_skills:
                run.ctx.loaded_skills.append(skill.name)
            rec.result = render_skill(run.state, skill)
        return tool_message(call, rec.result)
    run.ctx.pending.add(canonical)
    if canonical == NO_REPLY:
        return ReplyCandidate(channel="none", text=str(args.get("reason", "")), call_id=call.id)
    channel = "public" if canonical == REPLY_PUBLIC else "private"
    return ReplyCandidate(channel=channel, text=str(args.get("text", "")), call_id=call.id)


def _start(
    run, call: ToolCall, canonical: str, spec: ToolSpec, rec: ToolRecord
) -> dict[str, Any] | Started:
    fn = run.tools.get(canonical)
    if fn is None:
        rec.error, rec.result = (
            "no_executor",
            error("unavailable", f"{call.name} is unavailable right now"),
        )
        run.traj.faults.append(Fault(round=run.round, kind="no_executor", detail=canonical))
        return tool_message(call, rec.result)
    context = run.request.tool_context()
    given = call.arguments if isinstance(call.arguments, Mapping) else {}
    args = {**given, **{k: context[k] for k in spec.context_args}}
    rec.injected = list(spec.context_args)
    now = time.perf_counter()
    deadline = min(now + run.limits.tool_timeout_s, run.deadline)
    inline = getattr(run.tools, "is_inline", lambda name: False)(canonical)
    pending = start(lambda: fn(args), inline=inline)
    run.ctx.calls[canonical] += 1
    if spec.side_effects:
        run.ctx.session.add(run.request.viewer_id, canonical)
    return Started(
        call, canonical, rec, pending, deadline, max(0.0, deadline - now), spec.side_effects
    )


def collect(run, job: Started, intervals: list[tuple[float, float]]) -> dict[str, Any]:
    """Second pass: the result (or an error result) of a started call, after-tool hooks applied."""
    call, rec, err = job.call, job.rec, None
    try:
        value, begin, end = job.pending.wait(job.deadline - time.perf_counter())
        if end > job.deadline:  # an inline call that overran: its late result is discarded
            raise DeadlineExceeded(job.call.name)
        intervals.append((begin, end))
        rec.elapsed_s = end - begin
    except DeadlineExceeded:
        err, rec.elapsed_s = "timeout", job.timeout
        intervals.append((job.deadline - job.timeout, job.deadline))
        value = error(
            "timeout",
            f"{call.name} did not answer within {job.timeout:.1f} s; try again or answer without it",
        )
    except ToolError as exc:
        err, value = exc.kind, error(exc.kind, str(exc))
    except Exception as exc:  # noqa: BLE001 - a crashing executor must not crash the loop
        err, value = "exception", error("tool_failed", f"{call.name} failed unexpectedly")
        run.traj.faults.append(
            Fault(
                round=run.round,
                kind="tool_exception",
                detail=f"{call.name}: {type(exc).__name__}: {exc}"[:300],
            )
        )
    if err == "timeout":
        run.traj.faults.append(Fault(round=run.round, kind="tool_timeout", detail=call.name))
    res = run.hooks.run(
        "after_tool",
        run.ctx,
        ResultSubject(call, job.canonical, value, err),
        round=run.round,
        label=call.name,
    )
    run.traj.hook_events += res.events
    value, err = res.subject.result, res.subject.error
    if err is not None:
        run.ctx.calls[job.canonical] -= 1
        if job.side_effects:
            run.ctx.session.add(run.request.viewer_id, job.canonical, -1)
    if err == "malformed":
        run.traj.faults.append(Fault(round=run.round, kind="malformed_result", detail=call.name))
    if err is None:
        if not res.subject.tainted:  # a result that carried instructions supports no claim
            run.ctx.facts.append(value)
        run.ctx.performed.add(job.canonical)
    rec.result, rec.error = value, err
    return tool_message(call, value)
