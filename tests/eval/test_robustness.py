"""T3 Tool and Prompt Robustness sets: building, distractors, constraints and scoring."""

import dataclasses
import random
from types import SimpleNamespace

import pytest

from hat_jax import harness as hx
from hat_jax.eval import _constraints, _distractors, _robustness
from hat_jax.eval._items import EvalItem, write_set
from hat_jax.eval._kind import EvalContext
from hat_jax.eval._robustness import PENALTY, T3_PROMPT, T3_TOOL, tool_facts
from rl import sim

PRICE = "price_promotion/price-10/AP-003/screen"  # gold: get_price_promotion(AP-003)
BUY = "purchase_payment/buy-09/AP-003/screen"  # gold: get_price_promotion + check_inventory
NAMED = "price_promotion/price-10/AP-003/named"  # gold: search_products, then the price


@pytest.fixture(scope="module")
def ctx() -> EvalContext:
    return EvalContext.default()


@pytest.fixture(scope="module")
def tool_set(ctx):
    return T3_TOOL.build(ctx, split="test", size=30, seed=0)


@pytest.fixture(scope="module")
def prompt_set(ctx):
    return T3_PROMPT.build(ctx, split="test", size=30, seed=0)


def scenario(sid: str) -> sim.Scenario:
    return sim.default_scenarios().get(sid)


def run(kind, item, ctx, policy=None):
    prepared = kind.prepare(item, ctx)
    policy = policy or sim.ScriptedTeacher(prepared.scenario, prepared.state, ctx.world)
    traj = hx.run_agent(prepared.state, prepared.request, policy, prepared.tools, limits=ctx.limits)
    return kind.score(item, prepared, traj), traj


def tool_item(ctx, sid: str, names: list[str]) -> EvalItem:
    s = scenario(sid)
    looks = [next(x for x in _distractors.BANK if x.name == n) for n in names]
    records = [_distractors.spec_data(x, ctx.harness) for x in looks]
    return _robustness.tool_item(s, records, "t3_tool")


def prompt_item(sid: str, constraints: list[dict]) -> EvalItem:
    s = scenario(sid)
    return EvalItem(
        id=s.id,
        set="t3_prompt",
        family=s.family,
        scenario=s.to_dict(),
        harness={"items": [_constraints.text(c) for c in constraints]},
        expect={"constraints": constraints},
    )


def price(ctx) -> str:
    return f"¥{ctx.world.price_info('AP-003')['current_price']:g}"


# ------------------------------------------------------------------------------ building
def test_sets_are_deterministic_and_versioned_by_seed(ctx, tool_set, prompt_set, tmp_path):
    for kind, built in ((T3_TOOL, tool_set), (T3_PROMPT, prompt_set)):
        again = kind.build(ctx, split="test", size=30, seed=0)
        a, b = write_set(tmp_path / "a", built), write_set(tmp_path / "b", again)
        for name in ("items.jsonl", "manifest.json"):
            assert (a / name).read_bytes() == (b / name).read_bytes()
        assert kind.build(ctx, split="test", size=30, seed=1).version != built.version
        assert built.name == kind.name and len(built) == 30
        assert all(i.scenario["split"] == "test" and i.scenario["gold"]["calls"] for i in built)
    assert T3_TOOL.build(ctx, split="dev", size=5, seed=0).name == "t3_tool-dev"


def test_sample_is_stratified_by_family(ctx, tool_set):
    pool = [s for s in sim.default_scenarios().split("test") if s.gold.calls and tool_facts(s)]
    share = {f: sum(s.family == f for s in pool) / len(pool) for f in sim.FAMILIES}
    for family, want in share.items():
        got = sum(i.family == family for i in tool_set)
        assert abs(got - want * len(tool_set)) < 1, family


def test_size_beyond_the_pool_is_an_error(ctx):
    with pytest.raises(ValueError, match="eligible pool"):
        T3_TOOL.build(ctx, split="test", size=10_000, seed=0)


# ------------------------------------------------------------------------------ distractors
def test_distractors_are_valid_lookalikes_without_the_answer(ctx, tool_set):
    for item in tool_set:
        records = item.harness["distractors"]
        assert 2 <= len(records) <= 3
        prepared = T3_TOOL.prepare(item, ctx)
        h = prepared.state.harness
        assert hx.validate(h) == []
        gold = {c["tool"] for c in item.scenario["gold"]["calls"]}
        assert {r["mimics"] for r in records} & gold, item.id  # look-alikes of needed tools
        for r in records:
            spec = h.tool(r["name"])
            assert spec is not None and r["name"] in prepared.tools
            assert spec.parameters == h.tool(r["mimics"]).parameters
            allowing = [s for s in h.skills if r["mimics"] in s.allowed_tools]
            assert all(r["name"] in s.allowed_tools for s in allowing)
            s = prepared.scenario
            answer = prepared.tools[r["name"]](
                {"product_id": s.product_id, "query": "x", "viewer_id": "v1"}
            )
            assert not _distractors.leaks(answer, tool_facts(s)), (item.id, r["name"])


def test_an_invalid_distractor_is_refused(ctx):
    record = _distractors.spec_data(_distractors.BANK[0], ctx.harness)
    bad = {**record, "parameters": {"type": "array"}}
    with pytest.raises(ValueError, match="legacy_price_lookup.*invalid"):
        _distractors.with_distractors(ctx.harness, [bad])
    once = _distractors.with_distractors(ctx.harness, [record]).harness
    with pytest.raises(ValueError, match="clashes"):
        _distractors.with_distractors(once, [record])
    with pytest.raises(ValueError, match="unknown distractor"):
        _distractors.with_distractors(ctx.harness, [{**record, "name": "check_inventory"}])


def test_leak_check_catches_a_required_figure():
    fact = sim.Fact(id="i1.f1", intent="i1", kind="money", value="149")
    assert _distractors.leaks({"price": 149}, [fact]) == ["i1.f1"]
    assert _distractors.leaks({"price": 189}, [fact]) == []


# ------------------------------------------------------------------------------ Tool Robustness
def test_teacher_scores_one_on_tool_items(ctx, tool_set):
    for item in list(tool_set)[:12]:
        scores, _ = run(T3_TOOL, item, ctx)
        assert scores == {"tc": 1.0, "rc": 1.0, "adr": 1.0, "avg": 1.0}, item.id


def test_calling_a_distractor_lowers_tc(ctx):
    item = tool_item(ctx, PRICE, ["legacy_price_lookup", "archived_inventory_snapshot"])
    h, load = "snack_attack", hx.call("load_skill", name="product-qa")

    def script(*tools, text):
        calls = [hx.call(t, product_id="AP-003") for t in tools]
        return hx.ScriptedPolicy(
            [hx.AssistantTurn(tool_calls=(load, *calls)),
             hx.AssistantTurn(tool_calls=(hx.call("reply_public", text=text),))]
        )  # fmt: skip

    right, _ = run(T3_TOOL, item, ctx, script("get_price_promotion", text=f"@{h}, {price(ctx)}."))
    assert right == {"tc": 1.0, "rc": 1.0, "adr": 1.0, "avg": 1.0}
    both, _ = run(
        T3_TOOL,
        item,
        ctx,
        script("get_price_promotion", "legacy_price_lookup", text=f"@{h}, {price(ctx)}."),
    )
    assert both["tc"] == pytest.approx(1.0 - PENALTY) and both["rc"] == 1.0
    instead, traj = run(
        T3_TOOL, item, ctx, script("legacy_price_lookup", text=f"@{h}, let me check the price.")
    )
    assert [r.canonical for r in traj.tool_calls][1] == "legacy_price_lookup"
    assert "list_price_2025_season" in traj.tool_calls[1].result
    assert instead["tc"] == 0.0 and instead["rc"] == 0.0 and instead["adr"] == 0.0


# ---------------------------------------------------------------------------- Prompt Robustness
def test_constraints_reach_the_system_prompt_and_validate(ctx, prompt_set):
    kinds = set()
    for item in prompt_set:
        constraints = item.expect["constraints"]
        reply = [c for c in constraints if c["type"] != "tool_order"]
        assert 1 <= len(reply) <= 3
        kinds |= {c["type"] for c in constraints}
        prepared = T3_PROMPT.prepare(item, ctx)
        assert hx.validate(prepared.state.harness) == []
        system = hx.build_system_prompt(prepared.state, prepared.request)
        assert "## Session instructions" in system
        for c in constraints:
            assert hx.render_text(_constraints.text(c), prepared.state) in system
        gold = {c["tool"] for c in item.scenario["gold"]["calls"]}
        has_order = any(c["type"] == "tool_order" for c in constraints)
        assert has_order == ({"check_inventory", "get_price_promotion"} <= gold)
    assert kinds >= set(_constraints.REPLY_TYPES)


def test_missing_a_constraint_lowers_llm(ctx):
    h = "snack_attack"
    constraints = [
        {"type": "address_viewer", "handle": h},
        {"type": "mention_phrase", "phrase": "happy shopping"},
        {"type": "end_question"},
    ]
    item = prompt_item(PRICE, constraints)

    def script(text):
        return hx.ScriptedPolicy(
            [hx.AssistantTurn(tool_calls=(hx.call("load_skill", name="product-qa"),
                                          hx.call("get_price_promotion", product_id="AP-003"))),
             hx.AssistantTurn(tool_calls=(hx.call("reply_public", text=text),))]
        )  # fmt: skip

    good, _ = run(
        T3_PROMPT, item, ctx, script(f"@{h}, it is {price(ctx)}, happy shopping! Want one?")
    )
    assert good == {"adr": 1.0, "llm": 1.0, "tco": 1.0, "avg": 1.0}
    bad, _ = run(T3_PROMPT, item, ctx, script(f"@{h}, it is {price(ctx)} today. Want one?"))
    assert bad["llm"] == pytest.approx(2 / 3) and bad["adr"] == 1.0
    assert bad["avg"] == pytest.approx((1 + 2 / 3 + 1) / 3)


def test_calls_out_of_the_required_order_lower_tco(ctx):
    order = {"type": "tool_order", "first": "check_inventory", "then": "get_price_promotion"}
    item = prompt_item(BUY, [{"type": "end_question"}, order])
    loads = (hx.call("load_skill", name="product-qa"),
             hx.call("load_skill", name="purchase-guidance"))  # fmt: skip
    inv = hx.call("check_inventory", product_id="AP-003")
    cost = hx.call("get_price_promotion", product_id="AP-003")
    text = f"@lily_loves_skincare, {price(ctx)}, tap the product card to check out. Ready?"

    def script(*rounds):
        turns = [hx.AssistantTurn(tool_calls=calls) for calls in rounds]
        return hx.ScriptedPolicy(
            [*turns, hx.AssistantTurn(tool_calls=(hx.call("reply_public", text=text),))]
        )

    in_order, _ = run(T3_PROMPT, item, ctx, script((*loads, inv), (cost,)))
    assert in_order == {"adr": 1.0, "llm": 1.0, "tco": 1.0, "avg": 1.0}
    swapped, _ = run(T3_PROMPT, item, ctx, script((*loads, cost), (inv,)))
    assert swapped["tco"] == 0.0 and swapped["llm"] == 1.0 and swapped["adr"] == 1.0
    # The teacher plans the gold order (price first): it ignores the operator's order.
    teacher, _ = run(T3_PROMPT, item, ctx)
    assert teacher["tco"] == 0.0 and teacher["adr"] == 1.0


def test_without_an_order_constraint_tco_follows_the_gold_dependencies(ctx):
    item = prompt_item(NAMED, [{"type": "avoid_competitor", "name": "MegaMart"}])
    load = hx.call("load_skill", name="product-qa")
    find = hx.call("search_products", query="tee")
    cost = hx.call("get_price_promotion", product_id="AP-003")
    reply = hx.AssistantTurn(tool_calls=(hx.call("reply_public", text=f"@annie.w, {price(ctx)}."),))
    ok, _ = run(T3_PROMPT, item, ctx, hx.ScriptedPolicy(
        [hx.AssistantTurn(tool_calls=(load, find)), hx.AssistantTurn(tool_calls=(cost,)), reply]))  # fmt: skip
    assert ok["tco"] == 1.0 and ok["llm"] == 1.0
    early, _ = run(T3_PROMPT, item, ctx, hx.ScriptedPolicy(
        [hx.AssistantTurn(tool_calls=(load, cost, find)), reply]))  # fmt: skip
    assert early["tco"] == 0.0
    skipped, _ = run(
        T3_PROMPT, item, ctx, hx.ScriptedPolicy([hx.AssistantTurn(tool_calls=(load, cost)), reply])
    )
    assert skipped["tco"] == 0.0


def test_reply_constraint_rules():
    c = {"type": "address_viewer", "handle": "Annie.W"}
    assert _constraints.holds(c, " @annie.w, hi") and not _constraints.holds(c, "Hi @annie.w")
    assert _constraints.holds({"type": "max_chars", "value": 10}, "123456789")
    assert not _constraints.holds({"type": "max_chars", "value": 10}, "1234567890")
    assert _constraints.holds({"type": "end_question"}, "Want one? ")
    assert not _constraints.holds({"type": "end_question"}, "Want one?!.")
    comp = {"type": "avoid_competitor", "name": "DealHub"}
    assert not _constraints.holds(comp, "cheaper than dealhub", "")
    assert not _constraints.holds(comp, "ok", "unlike DealHub")
    assert _constraints.holds(comp, "DealHubs are not us")  # another word
    phrase = {"type": "mention_phrase", "phrase": "happy shopping"}
    assert _constraints.holds(phrase, "Happy   Shopping!") and not _constraints.holds(
        phrase, "happy"
    )
    with pytest.raises(ValueError, match="unknown prompt constraint"):
        _constraints.text({"type": "shout"})


def test_order_rule_skips_refused_calls():
    rec = lambda tool, error=None, **args: SimpleNamespace(
        canonical=tool, arguments=args, error=error
    )  # noqa: E731
    gold = [sim.GoldCall(tool="get_price_promotion", args={"product_id": "AP-003"})]
    order = [("check_inventory", "get_price_promotion")]
    refused = [rec("get_price_promotion", "not_allowed", product_id="AP-003"),
               rec("check_inventory", product_id="AP-003"),
               rec("get_price_promotion", product_id="AP-003")]  # fmt: skip
    assert _constraints.order_holds(refused, gold, order) == (True, [])
    ok, why = _constraints.order_holds(refused[2:], gold, order)
    assert not ok and why == ["get_price_promotion called before check_inventory"]


def test_draw_is_seeded_and_well_formed():
    a = _constraints.draw(random.Random(3), handle="h", gold_tools={"check_inventory"})
    b = _constraints.draw(random.Random(3), handle="h", gold_tools={"check_inventory"})
    assert a == b and 1 <= len(a) <= 3
    assert all(c["type"] in _constraints.REPLY_TYPES for c in a)
    both = {"check_inventory", "get_price_promotion"}
    assert (
        _constraints.draw(random.Random(3), handle="h", gold_tools=both)[-1]["type"] == "tool_order"
    )


def test_score_needs_a_trajectory(ctx, tool_set):
    item = tool_set[0]
    with pytest.raises(TypeError, match="Trajectory"):
        T3_TOOL.score(item, T3_TOOL.prepare(item, ctx), hx.AssistantTurn(content="hi"))


def test_prepare_gives_a_fresh_sandbox(ctx, tool_set):
    item = tool_set[0]
    a, b = T3_TOOL.prepare(item, ctx), T3_TOOL.prepare(item, ctx)
    assert a.extra["sandbox"] is not b.extra["sandbox"]
    assert dataclasses.asdict(a.request) == dataclasses.asdict(b.request)
