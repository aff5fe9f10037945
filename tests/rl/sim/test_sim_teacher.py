"""The scripted teacher: task preservation across Harness variants, recovery from faults and
from its own (injected) mistakes, and the failure of a policy that memorised canonical names."""

import dataclasses
import random

import pytest

from hat_jax import chat_format, hsa
from hat_jax import harness as hx
from rl import sim

ONES = (1.0, 1.0, 1.0, 1.0)


def vec(ep):
    r = ep.rewards
    return (r.accuracy, r.effectiveness, r.tool_rationality, r.skill_selection)


def clean(ep) -> bool:
    t = ep.trajectory
    return not t.final.fallback and not any(e.outcome in ("retry", "block") for e in t.hook_events)


@pytest.mark.slow
def test_teacher_scores_one_on_500_random_scenario_seed_pairs(room, scenarios, base):
    rng = random.Random(2026)
    dims_choices = [hsa.ALL, *({d} for d in hsa.Dim)]
    for k in range(500):
        s = scenarios[rng.randrange(len(scenarios))]
        dims = dims_choices[k % len(dims_choices)]
        strength = rng.choice((0.3, 0.6, 1.0))
        state = hsa.augment(base, seed=k, dims=dims, strength=strength, preserve=s.needs)
        ep = room.run(room.teacher(), s, seed=k, state=state)
        assert vec(ep) == ONES and clean(ep), (
            s.id,
            k,
            dims,
            ep.rewards.details,
            ep.trajectory.final,
        )


def test_teacher_scores_one_on_every_family_and_split(room, scenarios, base):
    seen = set()
    for k, s in enumerate(scenarios[::7]):
        if (s.family, s.split) in seen:
            continue
        seen.add((s.family, s.split))
        state = hsa.augment(base, seed=k, preserve=s.needs)
        ep = room.run(room.teacher(), s, seed=k, state=state)
        assert vec(ep) == ONES and clean(ep), (s.id, ep.rewards.details)
    assert len(seen) >= 35


def test_a_policy_replaying_canonical_names_fails_under_renames(room, scenarios, base, world):
    v0 = hx.HarnessState(harness=base)
    for k, s in enumerate(scenarios[::400]):
        replay = sim.ScriptedTeacher(s, v0, world)  # memorised Harness v0
        assert vec(room.run(replay, s, seed=k, state=v0)) == ONES
        renamed = hsa.augment(
            base, seed=k, dims={hsa.Dim.TOOL_DEF, hsa.Dim.SKILL_ID}, strength=1.0, preserve=s.needs
        )
        ep = room.run(sim.ScriptedTeacher(s, v0, world), s, seed=k, state=renamed)
        assert ep.rewards.effectiveness == 0.0 and ep.trajectory.final.fallback, s.id
        assert ep.rewards.tool_rationality < 1.0 and ep.rewards.skill_selection < 1.0
        assert any(r.error == "unknown_tool" for r in ep.trajectory.tool_calls)
        # The teacher that reads the current Harness solves the same episode.
        assert vec(room.run(room.teacher(), s, seed=k, state=renamed)) == ONES


def final_prompt(ep) -> str:
    """What the policy saw in its last round, rendered in the chat format."""
    call = ep.trajectory.model_calls[-1]
    tools = hx.tool_schemas(ep.state)
    return chat_format.render(call.messages, tools, add_generation_prompt=True)


@pytest.mark.parametrize("dim", list(hsa.Dim), ids=[d.value for d in hsa.Dim])
def test_each_dimension_alone_changes_the_rendered_prompt(room, pick, base, dim):
    s = pick(phrasing="mi-01")
    v0 = room.run(room.teacher(), s, seed=0, state=hx.HarnessState(harness=base))
    for seed in range(4):
        state = hsa.augment(base, seed=seed, dims={dim}, preserve=s.needs)
        ep = room.run(room.teacher(), s, seed=0, state=state)
        assert vec(ep) == ONES
        assert final_prompt(ep) != final_prompt(v0)


# ------------------------------------------------------------------------------ recovery paths
def test_tool_timeout_then_retry_recovers(room, pick, base):
    s = pick(phrasing="price-01")
    ep = room.run(
        room.teacher(),
        s,
        seed=1,
        state=hx.HarnessState(harness=base),
        faults=sim.FaultConfig(timeout=1.0, tools=("get_price_promotion",)),
    )
    errors = [r.error for r in ep.trajectory.tool_calls if r.canonical == "get_price_promotion"]
    assert errors == ["timeout", None]
    assert any(f.kind == "tool_timeout" for f in ep.trajectory.faults)
    assert vec(ep) == ONES


def test_real_timeout_is_cut_off_by_the_loop_and_retried(pick, world, base, scenarios):
    room = sim.LiveRoom(
        sim.SimConfig(limits=hx.Limits(tool_timeout_s=0.05)),
        world=world,
        harness=base,
        scenarios=scenarios,
    )
    s = pick(phrasing="price-01")
    faults = sim.FaultConfig(
        timeout=1.0, real_timeouts=True, sleep_s=0.3, tools=("get_price_promotion",)
    )
    ep = room.run(room.teacher(), s, seed=1, state=hx.HarnessState(harness=base), faults=faults)
    first = next(r for r in ep.trajectory.tool_calls if r.canonical == "get_price_promotion")
    assert first.error == "timeout" and first.elapsed_s <= 0.2
    assert vec(ep) == ONES


def test_malformed_result_then_retry_recovers(room, pick, base):
    s = pick(phrasing="stock-01")
    ep = room.run(
        room.teacher(),
        s,
        seed=2,
        state=hx.HarnessState(harness=base),
        faults=sim.FaultConfig(malformed=1.0, tools=("check_inventory",)),
    )
    errors = [r.error for r in ep.trajectory.tool_calls if r.canonical == "check_inventory"]
    assert errors == ["malformed", None] and vec(ep) == ONES


def test_denied_call_is_acknowledged_not_guessed(room, pick, base):
    s = pick(phrasing="price-01")
    ep = room.run(
        room.teacher(),
        s,
        seed=3,
        state=hx.HarnessState(harness=base),
        faults=sim.FaultConfig(denied=1.0, tools=("get_price_promotion",)),
    )
    errors = [r.error for r in ep.trajectory.tool_calls if r.canonical == "get_price_promotion"]
    assert errors == ["denied"]  # a refusal is not retried
    assert (
        "can't check the price" in ep.trajectory.final.public
        and "¥" not in ep.trajectory.final.public
    )
    assert vec(ep) == ONES


def test_persistent_failure_gives_up_after_one_retry(room, pick, base):
    s = pick(phrasing="stock-01")
    faults = sim.FaultConfig(timeout=1.0, persistent=True, tools=("check_inventory",))
    ep = room.run(room.teacher(), s, seed=4, state=hx.HarnessState(harness=base), faults=faults)
    assert [r.error for r in ep.trajectory.tool_calls if r.canonical == "check_inventory"] == [
        "timeout"
    ] * 2
    assert "follow up" in ep.trajectory.final.public and vec(ep) == ONES


@pytest.mark.parametrize("phrasing", ["mi-01", "mi-02"])
@pytest.mark.parametrize("inject", sim.INJECTIONS)
def test_injected_mistake_is_caught_by_a_hook_and_repaired(room, scenarios, base, inject, phrasing):
    # mi-02 about a product that is neither on screen nor in the line-up: search comes first.
    s = next(
        x
        for x in scenarios
        if x.phrasing == phrasing and (phrasing == "mi-01" or x.needs.min_rounds == 3)
    )
    hook = {
        "skip_skill": "require_reply_skill",
        "bad_arguments": "check_tool_arguments",
        "unknown_tool": "known_tool",
        "too_long": "reply_length",
        "unsupported_figure": "factual_risk",
    }[inject]
    needs = sim.injection_needs(s, inject)
    for state in (hx.HarnessState(harness=base), hsa.augment(base, seed=7, preserve=needs)):
        ep = room.run(room.teacher(inject), s, seed=5, state=state)
        events = [
            e
            for e in ep.trajectory.hook_events
            if e.hook == hook and e.outcome in ("retry", "block")
        ]
        assert events, (inject, ep.trajectory.hook_events)
        assert not ep.trajectory.final.fallback
        r = ep.rewards
        assert (r.accuracy, r.effectiveness, r.skill_selection) == (1.0, 1.0, 1.0), r.details
        expected = 0.75 if inject in ("bad_arguments", "unknown_tool") else 1.0
        assert r.tool_rationality == expected, r.details


def test_exhausted_retries_end_with_the_conservative_reply_or_silence(room, pick, base):
    s = pick(phrasing="price-01")
    stubborn = hx.ScriptedPolicy(
        [hx.AssistantTurn(tool_calls=(hx.call("reply_public", text="It's cheap!"),))],
        repeat_last=True,
    )
    ep = room.run(stubborn, s, seed=0, state=hx.HarnessState(harness=base))
    assert ep.trajectory.final.fallback and ep.trajectory.final.end == "fallback:retries_exhausted"
    assert ep.trajectory.final.public == base.hooks.fallback.conservative_reply
    assert (ep.rewards.accuracy, ep.rewards.effectiveness) == (1.0, 0.0)
    silent = dataclasses.replace(
        base,
        hooks=dataclasses.replace(
            base.hooks, fallback=dataclasses.replace(base.hooks.fallback, on_failure="suppress")
        ),
    )
    ep = room.run(stubborn, s, seed=0, state=hx.HarnessState(harness=silent))
    assert ep.trajectory.final.suppressed and ep.rewards.effectiveness == 0.0


def test_round_limit_ends_an_endless_tool_loop(room, pick, base):
    s = pick(phrasing="price-01")
    looping = hx.ScriptedPolicy(
        [hx.AssistantTurn(tool_calls=(hx.call("search_faq", query="price"),))], repeat_last=True
    )
    state = hsa.augment(base, seed=1, dims={hsa.Dim.SYSTEM_PROMPT}, preserve=s.needs)
    ep = room.run(looping, s, seed=0, state=state)
    assert ep.trajectory.rounds == state.harness.prompt.constraint("max_rounds")
    assert ep.trajectory.final.end == "fallback:max_rounds" and ep.rewards.effectiveness == 0.0
    assert ep.rewards.tool_rationality == 0.0  # redundant calls and a missing price call


def test_random_faults_are_recovered_and_not_held_against_the_teacher(world, base, scenarios):
    """Under heavy fault injection the teacher retries, gives up on denials, says it will follow
    up when a tool stays broken, and still scores 1: the rewards judge behaviour, not luck."""
    faults = sim.FaultConfig(timeout=0.3, malformed=0.2, denied=0.2)
    room = sim.LiveRoom(
        sim.SimConfig(faults=faults), world=world, harness=base, scenarios=scenarios
    )
    kinds, acknowledged = set(), 0
    for k in range(150):
        ep = room.run(room.teacher(), seed=k)
        kinds |= {f.kind for f in ep.faults}
        acknowledged += "follow up" in (ep.trajectory.final.public or "")
        assert vec(ep) == ONES and not ep.trajectory.final.fallback, (
            ep.scenario.id,
            ep.rewards.details,
        )
    assert kinds == set(sim.FAULT_KINDS) and acknowledged > 0


def test_unknown_injection_is_rejected(pick, base, world):
    with pytest.raises(ValueError, match="unknown injection"):
        sim.ScriptedTeacher(
            pick(phrasing="price-01"), hx.HarnessState(harness=base), world, inject="nap"
        )
    with pytest.raises(ValueError, match="bad_arguments needs a call with a product_id"):
        sim.ScriptedTeacher(
            pick(phrasing="chat-01"), hx.HarnessState(harness=base), world, inject="bad_arguments"
        )
