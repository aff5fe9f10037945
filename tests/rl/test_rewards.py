"""Rule-based rewards on hand-written replies: each deduction for the reason it exists."""

import dataclasses

import numpy as np
import pytest

from hat_jax import harness as hx
from hat_jax import hsa, livestream
from rl import advantages, sim
from rl.rewards import RewardConfig, Rewarder, clock_times, money, states, text_recall


@pytest.fixture(scope="module")
def env():
    world, base = (
        livestream.load_world(livestream.default_world_dir()),
        hx.load(livestream.default_world_dir()),
    )
    scenarios = sim.default_scenarios()
    room = sim.LiveRoom(world=world, harness=base, scenarios=scenarios)
    return world, base, scenarios, room


def find(scenarios, phrasing, **where):
    for s in scenarios:
        if s.phrasing == phrasing and all(
            str(getattr(s, k, "")) == v or v in s.id for k, v in where.items()
        ):
            return s
    raise LookupError(phrasing)


def episode(env, s, reply, *, extra=(), skills=None, private=None, state=None):
    """Runs Harness v0 with the gold calls (plus `extra`) and then `reply`."""
    world, base, _, room = env
    state = state or hx.HarnessState(harness=base)
    t = lambda name: state.surface_tool(name)
    loads = [
        hx.call(t("load_skill"), name=state.surface_skill(n))
        for n in (skills or sorted(s.needs.skills))
    ]
    waves = [[], []]
    for pattern, args in sim.plan_calls(s):
        waves[bool(pattern.after)].append(hx.call(t(pattern.tool), **args))
    turns = [hx.AssistantTurn(tool_calls=(*loads, *waves[0], *extra))]
    if waves[1]:
        turns.append(hx.AssistantTurn(tool_calls=tuple(waves[1])))
    final = [hx.call(t("reply_public"), text=reply)]
    if private:
        final.append(hx.call(t("reply_private"), text=private))
    turns.append(hx.AssistantTurn(tool_calls=tuple(final)))
    return room.run(hx.ScriptedPolicy(turns), s, seed=0, state=state)


def without(base, *hooks):
    """Harness v0 with some hooks off, so a reply the hook would stop reaches the rewards."""
    spec = dataclasses.replace(
        base.hooks,
        hooks=tuple(dataclasses.replace(h, enabled=h.name not in hooks) for h in base.hooks.hooks),
    )
    return hx.HarnessState(harness=dataclasses.replace(base, hooks=spec))


def r4(ep):
    r = ep.rewards
    return (r.accuracy, r.effectiveness, r.tool_rationality, r.skill_selection)


@pytest.fixture(scope="module")
def price_stock(env):
    """'how much is it and is it in stock?' about the product on screen, which is on promotion."""
    world = env[0]
    for s in env[2]:
        pid = s.gold.intents[0].product_id
        if (
            s.phrasing == "mi-01"
            and s.id.endswith("/screen")
            and world.price_info(pid)["promotion"]["status"] == "active"
        ):
            return s
    raise LookupError("mi-01")


@pytest.fixture(scope="module")
def P(env, price_stock):
    """Prices of the scenario's product: current (`now`), list (`was`), a wrong one (`bad`)."""
    info = env[0].price_info(price_stock.gold.intents[0].product_id)
    now, was = info["current_price"], info["list_price"]
    return {"now": f"¥{now:g}", "was": f"¥{was:g}", "bad": f"¥{now - 7:g}", "name": info["name"]}


def test_correct_reply_scores_one(env, price_stock, P):
    ep = episode(env, price_stock, f"@x, it is {P['now']} tonight and it's in stock.")
    assert r4(ep) == (1.0, 1.0, 1.0, 1.0), ep.rewards.details


def test_wrong_price_gives_accuracy_zero(env, price_stock, P):
    ep = episode(env, price_stock, f"@x, it is {P['bad']} tonight and it's in stock.")
    assert ep.trajectory.final.fallback  # the factual-risk hook refuses it twice, then falls back
    state = without(env[1], "factual_risk")
    ep = episode(env, price_stock, f"@x, it is {P['bad']} tonight and it's in stock.", state=state)
    assert ep.rewards.accuracy == 0.0 and any(
        P["bad"][1:] in d for d in ep.rewards.details["accuracy"]
    )


def test_list_price_quoted_as_the_live_price_is_inaccurate(env, price_stock, P):
    ep = episode(env, price_stock, f"@x, it is {P['was']} and it's in stock.")
    assert ep.rewards.accuracy == 0.0 and "expected" in ep.rewards.details["accuracy"][0]


def test_missed_intent_gives_effectiveness_half(env, price_stock, P):
    ep = episode(env, price_stock, f"@x, it is {P['now']} tonight.")
    assert ep.rewards.effectiveness == 0.5 and ep.rewards.accuracy == 1.0
    ep = episode(env, price_stock, "@x, great choice, you will love it!")
    assert ep.rewards.effectiveness == 0.0


def test_unneeded_tool_call_lowers_tool_rationality(env, price_stock, P):
    extra = (hx.call("get_lottery_status"),)
    ep = episode(
        env,
        price_stock,
        f"@x, it is {P['now']} tonight and it's in stock.",
        extra=extra,
        skills=["coupon-marketing", "multi-intent", "product-qa"],
    )
    assert (
        ep.rewards.tool_rationality == 0.75
        and "irrelevant get_lottery_status" in ep.rewards.details["tool_rationality"]
    )
    assert ep.rewards.skill_selection == 0.75  # and coupon-marketing was not needed either


def test_redundant_and_wrong_argument_calls(env, price_stock, P):
    pid = price_stock.gold.intents[0].product_id
    extra = (
        hx.call("check_inventory", product_id=pid),
        hx.call("check_inventory", product_id="EL-001"),
    )
    ep = episode(env, price_stock, f"@x, it is {P['now']} tonight and it's in stock.", extra=extra)
    assert ep.rewards.tool_rationality == 0.5
    assert {"redundant check_inventory", "check_inventory with wrong arguments"} <= set(
        ep.rewards.details["tool_rationality"]
    )


def test_missing_required_call_and_skill(env, price_stock, P):
    world, base, _, room = env
    pid = price_stock.gold.intents[0].product_id
    policy = hx.ScriptedPolicy(
        [
            hx.AssistantTurn(
                tool_calls=(
                    hx.call("load_skill", name="product-qa"),
                    hx.call("get_price_promotion", product_id=pid),
                )
            ),
            hx.AssistantTurn(
                tool_calls=(
                    hx.call("reply_public", text=f"@x, it's {P['now']} tonight and in stock."),
                )
            ),
        ]
    )
    ep = room.run(policy, price_stock, seed=0, state=hx.HarnessState(harness=base))
    assert ep.rewards.tool_rationality == 0.5  # one of two required calls
    assert ep.rewards.skill_selection == 0.5  # multi-intent was not loaded
    assert "missing check_inventory" in ep.rewards.details["tool_rationality"]


def test_order_details_spoken_publicly_are_inaccurate(env):
    s = find(env[2], "as-04", contains="DD2606150034")
    good = episode(
        env,
        s,
        "@x, I've sent you a private message about your order.",
        private="Order DD2606150034 is shipped. Tracking: SF Express SF1460099812.",
    )
    assert r4(good) == (1.0, 1.0, 1.0, 1.0), good.rewards.details
    leak = episode(
        env,
        s,
        "@x, your order is shipped, tracking SF1460099812; I've sent you a private message.",
        private="Order DD2606150034 is shipped. Tracking: SF Express SF1460099812.",
    )
    assert leak.rewards.accuracy == 0.0 and "reads order details aloud" in " ".join(
        leak.rewards.details["accuracy"]
    )


def test_generic_forbidden_claims(env, price_stock, P):
    world, base, _, room = env
    state = without(base, "forbidden_claims")
    ep = episode(
        env,
        price_stock,
        f"@x, I'm a real person! It is {P['now']} tonight and in stock.",
        state=state,
    )
    assert ep.rewards.accuracy == 0.0 and "claims to be a human" in " ".join(
        ep.rewards.details["accuracy"]
    )
    ep = episode(
        env, price_stock, f"@x, it is {P['now']} and in stock; I sent you a coupon.", state=state
    )
    assert ep.rewards.accuracy == 0.0 and "coupon was issued" in " ".join(
        ep.rewards.details["accuracy"]
    )


def test_moved_constraints_move_what_the_rewards_expect(env, price_stock, P):
    world, base, _, room = env
    reply = f"@lily_loves_skincare, {P['name']} is {P['now']} in the live room tonight, down from {P['was']}, and it's in stock."
    reply = reply[:200] if len(reply) > 200 else reply.ljust(121, "!")
    assert 120 < len(reply) <= 200
    v0 = episode(env, price_stock, reply)
    assert v0.rewards.accuracy == 1.0
    tight = dataclasses.replace(base, prompt=base.prompt.with_constraint("reply_max_chars", 120))
    scored = room.rewarder.score(price_stock, v0.trajectory, hx.HarnessState(harness=tight))
    assert scored.accuracy == 0.0 and "exceeds 120" in scored.details["accuracy"][0]
    assert room.rewarder.score(price_stock, v0.trajectory, {"reply_max_chars": 120}).accuracy == 0.0


def test_leaking_instructions_is_inaccurate(env, price_stock, P):
    world, base, _, room = env
    state = without(base, "no_prompt_leak")
    item = hx.render_text(base.prompt.blocks[1].items[3], state)
    ep = episode(env, price_stock, f"@x, it is {P['now']} and in stock. {item}", state=state)
    scored = room.rewarder.score(price_stock, ep.trajectory, state)
    assert scored.accuracy == 0.0 and "internal instructions" in scored.details["accuracy"][-1]


def test_facts_from_the_policys_own_coupon(env):
    """A generic coupon request answered with a product coupon: the facts follow the coupon
    the policy actually received, not the one the gold call would have given."""
    world, base, scenarios, room = env
    s = next(x for x in scenarios if x.phrasing == "cp-01" and x.comments[0].viewer_id == "v1004")
    policy = hx.ScriptedPolicy(
        [
            hx.AssistantTurn(
                tool_calls=(
                    hx.call("load_skill", name="general-reply"),
                    hx.call("load_skill", name="coupon-marketing"),
                    hx.call("issue_coupon", product_id="BT-001"),
                )
            ),
            lambda messages, tools: hx.AssistantTurn(
                tool_calls=(
                    hx.call(
                        "reply_public",
                        text=f"@x, you got a ¥{_coupon(messages)['discount']:g} off coupon on orders of ¥{_coupon(messages)['min_spend']:g} or more.",
                    ),
                )
            ),
        ]
    )
    ep = room.run(policy, s, seed=0, state=hx.HarnessState(harness=base))
    assert r4(ep) == (1.0, 1.0, 1.0, 1.0), ep.rewards.details


def _coupon(messages):
    import json

    return json.loads(
        next(
            m["content"]
            for m in reversed(messages)
            if m["role"] == "tool" and "discount" in m["content"]
        )
    )


def test_reward_vector_order_matches_the_advantage_columns(env, price_stock, P):
    ep = episode(env, price_stock, f"@x, it is {P['now']} tonight.")
    r = ep.rewards
    np.testing.assert_array_equal(r.as_array(), [getattr(r, d) for d in advantages.REWARD_DIMS])
    assert set(r.to_dict()) == {*advantages.REWARD_DIMS, "details"}


def test_penalty_is_configurable(env, price_stock, P):
    world, base, _, room = env
    ep = episode(
        env,
        price_stock,
        f"@x, it is {P['now']} tonight and it's in stock.",
        extra=(hx.call("search_faq", query="x", product_id="EL-001"),),
    )
    strict = Rewarder(base, RewardConfig(penalty=0.5)).score(
        price_stock, ep.trajectory, hx.HarnessState(harness=base)
    )
    assert strict.tool_rationality == 0.5 and ep.rewards.tool_rationality == 0.75
    with pytest.raises(ValueError, match="penalty"):
        RewardConfig(penalty=0)


def test_augmented_state_scores_on_canonical_names(env, price_stock, P):
    world, base, _, room = env
    state = hsa.augment(base, seed=3, strength=1.0, preserve=price_stock.needs)
    ep = episode(env, price_stock, f"@x, it is {P['now']} tonight and it's in stock.", state=state)
    assert r4(ep) == (1.0, 1.0, 1.0, 1.0), ep.rewards.details


# ------------------------------------------------------------------------------ fact reading
def test_money_and_times():
    assert money("only ¥149, or 149.5 yuan, RMB 20 and 30元") == {149.0, 149.5, 20.0, 30.0}
    assert money("149 people") == set()
    assert states("a coupon with no minimum spend", "money", "0") and not states(
        "¥5 off", "money", "0"
    )
    assert clock_times("draw at 21:00, ends 11:59 pm, opens 9am") == {"21:00", "23:59", "09:00"}


def test_text_and_number_facts():
    assert states(
        "It is 30% cashmere and 70% merino wool.", "text", "30% cashmere, 70% merino wool"
    )
    assert not states("It is cashmere and merino wool.", "text", "30% cashmere, 70% merino wool")
    assert text_recall("arrives in 2-4 days", "2-4 days") == (1.0, True)
    assert states("returns within 7 days", "number", "7") and not states("¥7777", "number", "7")
    assert states("Sold out, sorry", "any", "sold out|out of stock")
