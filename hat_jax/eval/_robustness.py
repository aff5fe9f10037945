"""T3 robustness sets (paper §4.2, appendix E.3): Tool Robustness and Prompt Robustness.

Both draw their items from the scenarios of one split (test by default) whose gold needs tool
calls: a deterministic sample, stratified by family (proportional allocation, largest
remainders), ordered by a hash of the seed and the scenario id. Item ids are scenario ids.

- `T3_TOOL` ("t3_tool"): each item's Harness gains two or three distractor tools that look like
  the tools the item needs (see `hat_jax.eval._distractors`). Metrics: TC, the share of the
  gold calls made (gold call patterns, canonical names) minus `PENALTY` per call of a
  distractor; RC, the share of the required tool-returned facts the reply states (the
  Rewarder's fact checks, `source` facts resolved from the policy's own results); ADR, the core
  query addressed (the Rewarder's Effectiveness: 1 every intent answered, 0.5 some, 0 none);
  avg = mean(TC, RC, ADR).
- `T3_PROMPT` ("t3_prompt"): each item's system prompt gains a "Session instructions" block
  with one to three reply constraints and, when its gold calls include both tools, a required
  tool order (see `hat_jax.eval._constraints`). Metrics: ADR (as above); LLM, the share of the
  reply constraints met (0 for a fallback or suppressed reply: the policy produced none);
  TCO, 1 when every gold call is made after its predecessors (its `after` tools and the
  required order) succeeded; avg = mean(ADR, LLM, TCO).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import harness as hx
from hat_jax.eval import _constraints, _distractors
from hat_jax.eval._items import EvalItem, EvalSet, stable_seed
from hat_jax.eval._kind import EvalContext, Prepared, set_name
from hat_jax.eval._qa_sets import rewarder, room_scenarios
from rl import sim
from rl.rewards import RewardConfig, Rewarder
from rl.rewards._rules import _Episode

PENALTY = RewardConfig().penalty  # TC deduction per distractor call
SESSION_BLOCK = {"id": "session_rules", "title": "Session instructions", "after": "global_rules"}
# Intent kind -> (tools whose results answer it, numbers of its facts that are not read from a
# tool result: an apology, "I sent you a message", the variant echoed back ...).
TOOL_FACTS: Mapping[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "price": (("get_price_promotion",), ()),
    "saving": (("get_price_promotion",), ()),
    "promo_window": (("get_price_promotion",), ()),
    "order_limit": (("get_price_promotion",), ()),
    "how_to_buy": (("get_price_promotion", "check_inventory"), (2,)),
    "stock": (("check_inventory",), ()),
    "stock_variant": (("check_inventory",), (1,)),
    "spec": (("get_product_detail",), ()),
    "spec_overview": (("get_product_detail",), ()),
    "shipping": (("get_product_detail",), ()),
    "shipping_region": (("get_product_detail",), ()),
    "returns": (("get_after_sales_policy",), ()),
    "warranty": (("get_after_sales_policy",), ()),
    "negative": (("get_after_sales_policy",), (1,)),
    "order_status": (("get_order_status",), (1,)),
    "coupon": (("issue_coupon",), ()),
    "coupon_product": (("issue_coupon",), ()),
    "lottery": (("get_lottery_status",), ()),
    "follow_gift": (("claim_follow_gift",), ()),
}


def _h(*parts: Any) -> int:
    return stable_seed(*parts, width=8)


def scenarios_for(ctx: EvalContext, split: str) -> sim.ScenarioSet:
    """The scenarios of `split` in the context's room and world (`_qa_sets.room_scenarios`:
    the room's cached pool on the bundled world)."""
    return room_scenarios(ctx).split(split)


def tool_facts(s: sim.Scenario) -> list[sim.Fact]:
    """The facts of `s` that are read from the result of a required tool call."""
    called = {c.tool for c in s.gold.calls}
    out = []
    for intent in s.gold.intents:
        tools, own = TOOL_FACTS.get(intent.kind, ((), ()))
        if not called & set(tools):
            continue
        own_ids = {f"{intent.id}.f{n}" for n in own}
        out += [f for f in s.gold.facts if f.intent == intent.id and f.id not in own_ids]
    return out


def sample(pool: Sequence[sim.Scenario], size: int, seed: int, what: str) -> list[sim.Scenario]:
    """`size` scenarios, stratified by family (proportional, largest remainders)."""
    if not 0 < size <= len(pool):
        raise ValueError(
            f"{what}: size must be in [1, {len(pool)}] (the eligible pool), got {size}"
        )
    by_family: dict[str, list[sim.Scenario]] = {}
    for s in sorted(pool, key=lambda s: _h(seed, s.id)):
        by_family.setdefault(s.family, []).append(s)
    quota = {f: size * len(v) / len(pool) for f, v in by_family.items()}
    take = {f: int(q) for f, q in quota.items()}
    rest = sorted(quota, key=lambda f: (take[f] - quota[f], _h(seed, f)))
    for f in rest[: size - sum(take.values())]:
        take[f] += 1
    chosen = [s for f in sorted(by_family) for s in by_family[f][: take[f]]]
    return sorted(chosen, key=lambda s: _h(seed, "order", s.id))


def _eligible(ctx: EvalContext, split: str) -> list[sim.Scenario]:
    return [s for s in scenarios_for(ctx, split) if s.gold.calls and tool_facts(s)]


def _episode(item: EvalItem, prepared: Prepared, result: Any) -> tuple[sim.Scenario, _Episode]:
    if not isinstance(result, hx.Trajectory):
        raise TypeError(f"{item.id}: expected an hx.Trajectory, got {type(result).__name__}")
    scenario = prepared.scenario or sim.Scenario.from_dict(hx.thaw(item.scenario))
    return scenario, _Episode(result)


def adr(scenario: sim.Scenario, ep: _Episode, harness: hx.Harness) -> float:
    """The core query addressed: the Rewarder's Effectiveness (0, 0.5 or 1)."""
    return rewarder(harness).effectiveness(scenario, ep)[0]


def _agent_prepared(item: EvalItem, ctx: EvalContext, state: hx.HarnessState, extra_tools=None):
    scenario = sim.Scenario.from_dict(hx.thaw(item.scenario))
    sandbox = sim.Sandbox(ctx.world)
    tools = sandbox.tools if extra_tools is None else sandbox.tools.merged(extra_tools)
    return Prepared(
        state=state,
        request=scenario.request(ctx.world),
        tools=tools,
        scenario=scenario,
        extra={"sandbox": sandbox},
    )


# ------------------------------------------------------------------------------ Tool Robustness
def tool_item(s: sim.Scenario, records: Sequence[dict[str, Any]], name: str) -> EvalItem:
    """The t3_tool item of scenario `s` with the distractor tools `records` (`spec_data`)."""
    return EvalItem(
        id=s.id,
        set=name,
        family=s.family,
        scenario=s.to_dict(),
        harness={"distractors": list(records)},
        expect={
            "calls": [c.tool for c in s.gold.calls],
            "rc_facts": [f.id for f in tool_facts(s)],
            "distractors": {r["name"]: r["mimics"] for r in records},
        },
    )


@dataclasses.dataclass(frozen=True)
class _T3ToolKind:
    """T3 Tool Robustness (see the module docstring)."""

    name: str = "t3_tool"
    metrics: tuple[str, ...] = ("tc", "rc", "adr", "avg")

    def build(self, ctx: EvalContext, *, split: str = "test", size: int, seed: int) -> EvalSet:
        name = set_name(self.name, split)
        items = []
        for s in sample(_eligible(ctx, split), size, seed, name):
            rng = random.Random(_h(seed, "distractors", s.id))
            looks = self._choose(ctx, s, rng)
            records = [_distractors.spec_data(look, ctx.harness) for look in looks]
            _distractors.with_distractors(ctx.harness, records)  # raises if invalid
            items.append(tool_item(s, records, name))
        generator = {"kind": self.name, "split": split, "size": size, "seed": seed,
                     "penalty": PENALTY, "bank": [look.name for look in _distractors.BANK]}  # fmt: skip
        return EvalSet(name, tuple(items), generator, room=ctx.room)

    @staticmethod
    def _choose(ctx: EvalContext, s: sim.Scenario, rng: random.Random) -> list:
        """Two or three distractors: look-alikes of the needed tools first, then of others the
        Harness has (the micro room's lacks some mimicked tools); one that would answer with a
        required fact is discarded."""
        n = rng.choice((2, 3))
        needed = list(dict.fromkeys(c.tool for c in s.gold.calls))
        first = [rng.sample(_distractors.candidates(t), 1) for t in needed]
        own = [look for t in needed for look in _distractors.candidates(t)]
        others = [look for look in _distractors.BANK
                  if look not in own and ctx.harness.tool(look.mimics) is not None]  # fmt: skip
        ordered = [x for group in first for x in group]
        ordered += rng.sample(own, len(own)) + rng.sample(others, len(others))
        facts = tool_facts(s)
        products = dict.fromkeys([*(i.product_id for i in s.gold.intents if i.product_id),
                                  s.product_id])  # fmt: skip
        chosen: list = []
        for look in dict.fromkeys(ordered):
            run = _distractors.executor(look.name, ctx.world)
            answers = []
            for pid in products:
                args = {"product_id": pid, "query": s.comments[0].text,
                        "viewer_id": s.comments[0].viewer_id}  # fmt: skip
                try:
                    answers.append(run(args))
                except hx.ToolError:
                    continue
            if not _distractors.leaks(answers, facts):
                chosen.append(look)
            if len(chosen) == n:
                return chosen
        raise ValueError(f"{s.id}: fewer than {n} distractors answer without a required fact")

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared:
        records = hx.thaw(item.harness).get("distractors", [])
        state = _distractors.with_distractors(ctx.harness, records)
        return _agent_prepared(item, ctx, state, _distractors.toolbox(records, ctx.world))

    def score(self, item: EvalItem, prepared: Prepared, result: Any) -> dict[str, float]:
        scenario, ep = _episode(item, prepared, result)
        distractors = set(item.expect.get("distractors", {}))
        ran = [r for r in ep.calls if r.canonical and r.error not in _constraints._MISTAKES]
        covered = [
            any(p.matches(r.canonical, r.arguments) for r in ran) for p in scenario.gold.calls
        ]
        wrong = sum(r.canonical in distractors for r in ep.calls)
        tc = max(0.0, sum(covered) / len(covered) - PENALTY * wrong) if covered else 1.0
        wanted = set(item.expect.get("rc_facts", ()))
        facts = [f for f in scenario.gold.facts if f.id in wanted]
        rc = sum(Rewarder._stated(f, ep) for f in facts) / len(facts) if facts else 1.0
        a = adr(scenario, ep, prepared.state.harness)
        return {"tc": tc, "rc": rc, "adr": a, "avg": (tc + rc + a) / 3}


# ---------------------------------------------------------------------------- Prompt Robustness
def with_instructions(harness: hx.Harness, items: Sequence[str]) -> hx.HarnessState:
    """The Harness state with `items` as a "Session instructions" prompt block (after the
    rules block), validated.

    Raises:
      ValueError: the block exists already, or the Harness fails `hx.validate`.
    """
    prompt = harness.prompt
    if any(b.id == SESSION_BLOCK["id"] for b in prompt.blocks):
        raise ValueError(f"the Harness already has a prompt block {SESSION_BLOCK['id']!r}")
    block = hx.PromptBlock(id=SESSION_BLOCK["id"], title=SESSION_BLOCK["title"], items=tuple(items))
    ids = [b.id for b in prompt.blocks]
    at = ids.index(SESSION_BLOCK["after"]) + 1 if SESSION_BLOCK["after"] in ids else len(ids)
    blocks = (*prompt.blocks[:at], block, *prompt.blocks[at:])
    out = dataclasses.replace(harness, prompt=dataclasses.replace(prompt, blocks=blocks))
    problems = hx.validate(out)
    if problems:
        raise ValueError(f"the session instructions {list(items)} are invalid: {problems}")
    return hx.HarnessState(harness=out)


@dataclasses.dataclass(frozen=True)
class _T3PromptKind:
    """T3 Prompt Robustness (see the module docstring)."""

    name: str = "t3_prompt"
    metrics: tuple[str, ...] = ("adr", "llm", "tco", "avg")

    def build(self, ctx: EvalContext, *, split: str = "test", size: int, seed: int) -> EvalSet:
        name = set_name(self.name, split)
        items = []
        for s in sample(_eligible(ctx, split), size, seed, name):
            rng = random.Random(_h(seed, "constraints", s.id))
            drawn = _constraints.draw(
                rng, handle=s.comments[0].handle, gold_tools={c.tool for c in s.gold.calls}
            )
            texts = [_constraints.text(c) for c in drawn]
            with_instructions(ctx.harness, texts)  # raises if invalid
            items.append(
                EvalItem(
                    id=s.id,
                    set=name,
                    family=s.family,
                    scenario=s.to_dict(),
                    harness={"block": dict(SESSION_BLOCK), "items": texts},
                    expect={"constraints": drawn},
                )
            )
        generator = {"kind": self.name, "split": split, "size": size, "seed": seed,
                     "reply_types": list(_constraints.REPLY_TYPES),
                     "orders": [list(k) for k in _constraints.ORDERS]}  # fmt: skip
        return EvalSet(name, tuple(items), generator, room=ctx.room)

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared:
        state = with_instructions(ctx.harness, list(item.harness.get("items", ())))
        return _agent_prepared(item, ctx, state)

    def score(self, item: EvalItem, prepared: Prepared, result: Any) -> dict[str, float]:
        scenario, ep = _episode(item, prepared, result)
        constraints = [hx.thaw(c) for c in item.expect["constraints"]]
        reply = [c for c in constraints if c["type"] != _constraints.ORDER_TYPE]
        orders = [(c["first"], c["then"]) for c in constraints if c not in reply]
        if ep.replied and not ep.traj.final.fallback:
            met = [_constraints.holds(c, ep.public, ep.private) for c in reply]
            llm = sum(met) / len(met) if met else 1.0
        else:
            llm = 0.0
        tco = float(_constraints.order_holds(ep.traj.tool_calls, scenario.gold.calls, orders)[0])
        a = adr(scenario, ep, prepared.state.harness)
        return {"adr": a, "llm": llm, "tco": tco, "avg": (a + llm + tco) / 3}


T3_TOOL = _T3ToolKind()
T3_PROMPT = _T3PromptKind()
