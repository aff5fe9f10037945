"""The scripted teacher: the gold trajectory of a scenario under any Harness state.

`ScriptedTeacher` is a `PolicyModel` (the demo's stand-in for the paper's strong teacher). It
speaks only the surface names of the `HarnessState` it acts in: it loads the scenario's Skills
under their current names, calls the gold tools under their current names, reads the rules of
the Harness (reply length and sentence limits, round limit) and words its reply from the tool
results it receives. It is stateless across calls: each turn is derived from the conversation
so far, so it recovers like a policy would:

- a tool that timed out or returned a malformed result is called again once;
- a denied or repeatedly failing tool is given up, and the reply says it will follow up;
- a hook message (a missing Reply Skill, bad arguments, a reply that is too long or states an
  unsupported figure) is answered by fixing the problem.

`inject` makes the teacher commit one mistake on purpose, which a Hook then catches and the
teacher repairs: `skip_skill`, `bad_arguments`, `unknown_tool`, `too_long`,
`unsupported_figure`. Such trajectories show recovery (paper §3.4 keeps a small fraction of
complete retry histories); `injection_needs` says what the Harness must keep for it to work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import harness as hx
from hat_jax import hsa, livestream
from rl.sim._compose import Clause, Results, clause, compose
from rl.sim._scenario import GoldCall, Scenario

INJECTIONS = ("skip_skill", "bad_arguments", "unknown_tool", "too_long", "unsupported_figure")
_RETRY_HOOK = {
    "skip_skill": "require_reply_skill",
    "bad_arguments": "check_tool_arguments",
    "too_long": "reply_length",
    "unsupported_figure": "factual_risk",
}
_FAQ_KINDS = ("usage", "payment", "invoice", "address_change")
_SLIPS = ("invalid_arguments", "unknown_tool")
_WRONG_FIGURE = "Only 7 left at ¥7777!"
_REPLY_TOOLS = (hx.FLOW_TOOLS[1], hx.FLOW_TOOLS[2], hx.FLOW_TOOLS[3])
MAX_FAULT_RETRIES = 1


def injection_needs(scenario: Scenario, inject: str | None) -> hsa.Preserve:
    """What the Harness must keep for the teacher (with `inject`) to solve `scenario`."""
    if inject is None:
        return scenario.needs
    if inject not in INJECTIONS:
        raise ValueError(f"unknown injection {inject!r}; choose from {INJECTIONS}")
    hooks = {_RETRY_HOOK[inject]} if inject in _RETRY_HOOK else set()
    return scenario.needs.merged(
        hsa.Preserve(min_rounds=scenario.needs.min_rounds + 1, retry_hooks=hooks)
    )


def plan_calls(scenario: Scenario) -> list[tuple[GoldCall, dict[str, Any]]]:
    """The calls the teacher makes, each with the arguments it passes."""
    text = " ".join(c.text for c in scenario.comments).lower()
    out = []
    for call in scenario.gold.calls:
        args = dict(hx.thaw(call.args))
        if call.terms:
            args["query"] = next((t for t in call.terms if t.lower() in text), call.terms[0])
        out.append((call, args))
    for i in scenario.gold.intents:
        if i.kind in _FAQ_KINDS:
            args = {"query": i.detail["question"]}
            if i.product_id:
                args["product_id"] = i.product_id
            pattern = GoldCall(tool="search_faq", args={}, free=("query", "product_id"))
            if all(a != args for _, a in out):
                out.append((pattern, args))
    return out


class ScriptedTeacher:
    """Gold behaviour for one scenario in one Harness state (see module docstring).

    Args:
      scenario: what is asked and what a correct answer needs.
      state: the Harness the teacher acts in (it uses only its surface names).
      world: the world (product names, the product on screen, the host's name).
      inject: one deliberate mistake, from `INJECTIONS`, or None.
    """

    inline = True  # pure computation: the loop may call it on its own thread

    def __init__(
        self,
        scenario: Scenario,
        state: hx.HarnessState,
        world: livestream.World,
        *,
        inject: str | None = None,
    ):
        if inject is not None and inject not in INJECTIONS:
            raise ValueError(f"unknown injection {inject!r}; choose from {INJECTIONS}")
        self.scenario, self.state, self.world, self.inject = scenario, state, world, inject
        self.plan = plan_calls(scenario)
        if inject == "bad_arguments" and not any("product_id" in a for _, a in self.plan):
            raise ValueError(f"bad_arguments needs a call with a product_id ({scenario.id})")
        if inject == "unknown_tool" and not self.plan:
            raise ValueError(f"unknown_tool needs a tool call ({scenario.id})")
        prompt = state.harness.prompt
        self.max_chars = prompt.constraint("reply_max_chars")
        self.max_sentences = prompt.constraint("reply_max_sentences")
        self.max_rounds = prompt.constraint("max_rounds")

    # ------------------------------------------------------------------ reading the conversation
    def _read(self, messages: Sequence[Mapping[str, Any]]):
        """Results so far, loaded Skills, attempts per planned call, rounds, whether a reply was
        already tried (or a hook spoke), and whether a call was already refused as invalid."""
        calls, results, loaded, replied, slipped = {}, Results(), set(), False, False
        attempts: dict[int, list[str]] = {}
        for m in messages:
            for c in m.get("tool_calls") or ():
                calls[c["id"]] = (c["function"]["name"], c["function"]["arguments"])
            if m["role"] != "tool" or m.get("tool_call_id") not in calls:
                continue
            name, args = calls[m["tool_call_id"]]
            canonical = self.state.resolve_tool(name)
            value = _json(m["content"])
            if canonical == "load_skill" and not _is_error(value):
                loaded.add(args.get("name"))
            elif canonical in _REPLY_TOOLS:
                replied = True
            elif _is_error(value) and value["error"].get("type") in _SLIPS:
                slipped = True
            if canonical is not None and canonical not in hx.FLOW_TOOLS:
                results.add(canonical, args, value)
                for k, (pattern, planned) in enumerate(self.plan):
                    if pattern.tool == canonical and dict(args) == planned:
                        attempts.setdefault(k, []).append(_outcome(value))
        rounds = sum(m["role"] == "assistant" for m in messages)
        hooked = any(m["role"] == "user" for m in messages[2:])
        return results, loaded, attempts, rounds, replied or hooked, slipped

    # ------------------------------------------------------------------ acting
    def generate(self, messages, tools=None, sampling=None) -> hx.AssistantTurn:
        results, loaded, attempts, rounds, retried, slipped = self._read(messages)
        if rounds == 0 and self.inject == "skip_skill":
            return self._turn(self._reply(results, draft="Let me check that for you!"), rounds)
        missing = [s for s in self._skills() if s not in loaded]
        loads = [self._make("load_skill", {"name": s}) for s in missing]
        last = rounds + 1 >= self.max_rounds
        calls = [] if last else self._next_calls(attempts, slip=not slipped)
        if calls or (loads and not last):
            names = ", ".join(missing) or "no more Skills"
            tools = ", ".join(dict.fromkeys(c.name for c in calls)) or "no tools yet"
            return self._turn(loads + calls, rounds, f"Load {names}; call {tools}.")
        mistake = self.inject if self.inject in ("too_long", "unsupported_figure") else None
        reply = self._reply(results, mistake=None if retried else mistake)
        limits = f"at most {self.max_sentences} sentences under {self.max_chars} characters"
        return self._turn(loads + reply, rounds, f"Answer every question, {limits}.")

    def _skills(self) -> list[str]:
        skills = [self.state.surface_skill(s) for s in sorted(self.scenario.needs.skills)]
        if None in skills:
            raise RuntimeError(f"{self.scenario.id}: a needed Skill is masked in this Harness")
        kinds = {s.name: s.kind for s in self.state.harness.skills}
        return sorted(skills, key=lambda s: kinds[s] != "reply")

    def _tool(self, canonical: str) -> str:
        name = self.state.surface_tool(canonical)
        if name is None:
            raise RuntimeError(f"{self.scenario.id}: this Harness has no tool {canonical!r}")
        return name

    def _make(self, canonical: str, args: Mapping[str, Any]) -> hx.ToolCall:
        return hx.ToolCall(id="", name=self._tool(canonical), arguments=dict(args))

    def _next_calls(self, attempts, *, slip: bool) -> list[hx.ToolCall]:
        """Planned calls still to make: new ones whose predecessors succeeded, and retries of
        calls that timed out or came back malformed (once); denied calls are given up."""
        succeeded = {p.tool for k, (p, _) in enumerate(self.plan) if "ok" in attempts.get(k, ())}
        out = []
        for k, (pattern, args) in enumerate(self.plan):
            history = attempts.get(k, [])
            if "ok" in history or "business" in history or not set(pattern.after) <= succeeded:
                continue
            if "denied" in history or history.count("fault") > MAX_FAULT_RETRIES:
                continue
            call = self._call(pattern.tool, args, slip=slip)
            slip = slip and call.arguments == args and call.name == self._tool(pattern.tool)
            out.append(call)
        return out

    def _call(self, canonical: str, args: Mapping[str, Any], *, slip: bool) -> hx.ToolCall:
        """The call, or (once, with `slip`) the injected mistake made instead of it."""
        call = self._make(canonical, args)
        if slip and self.inject == "bad_arguments" and "product_id" in args:
            bad = {**args, "product_id": args["product_id"].lower() + "x"}
            return hx.ToolCall(id="", name=call.name, arguments=bad)
        if slip and self.inject == "unknown_tool":
            wrong = canonical if canonical != call.name else f"{call.name}_v2"
            return hx.ToolCall(id="", name=wrong, arguments=call.arguments)
        return call

    def _turn(self, calls: list[hx.ToolCall], rounds: int, reasoning: str = "") -> hx.AssistantTurn:
        numbered = tuple(
            hx.ToolCall(id=f"call_{rounds + 1}_{k}", name=c.name, arguments=c.arguments)
            for k, c in enumerate(calls)
        )
        return hx.AssistantTurn(reasoning=reasoning, tool_calls=numbered)

    def _reply(self, results: Results, *, draft: str | None = None, mistake: str | None = None):
        handles = [c.handle for c in self.scenario.comments]
        if draft is not None:
            return [self._make("reply_public", {"text": f"@{handles[0]}, {draft}"})]
        clauses = [clause(i, results, self.world) for i in self.scenario.gold.intents]
        # The figure mistake must be the only thing wrong: leave room for it within the limits.
        room = len(_WRONG_FIGURE) + 1 if mistake == "unsupported_figure" else 0
        public, private = compose(
            clauses,
            handles,
            max_chars=self.max_chars - room,
            max_sentences=max(1, self.max_sentences - bool(room)),
            strict=False,
        )
        if mistake == "too_long":  # over the Harness's limit, within the tool's own schema
            padded = f"{public} {_filler(clauses)} {_filler(clauses)}"
            public = padded[: max(self.max_chars + 40, 400)].rsplit(" ", 1)[0] + "."
        elif mistake == "unsupported_figure":
            public = f"{public} {_WRONG_FIGURE}"
        calls = [self._make("reply_public", {"text": public})]
        if private:
            calls.append(self._make("reply_private", {"text": private}))
        return calls


def _filler(clauses: Sequence[Clause]) -> str:
    return (
        " ".join(c.full for c in clauses) + " Thanks for watching and enjoy the rest of the show."
    )


def _json(content: Any) -> Any:
    if not isinstance(content, str):
        return content
    try:
        return json.loads(content)
    except ValueError:
        return content


def _is_error(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("error"), Mapping)


def _outcome(value: Any) -> str:
    """ok, business (an answer such as "not found"), denied, fault, or invalid (our mistake)."""
    if not _is_error(value):
        return "ok" if isinstance(value, Mapping) else "fault"
    kind = value["error"].get("type")
    if kind == "tool_error":
        return "business"
    if kind == "denied":
        return "denied"
    if kind in ("invalid_arguments", "unknown_tool", "not_allowed", "rejected"):
        return "invalid"
    return "fault"
