"""augment(): determinism, the five dimensions one at a time, task preservation, consistency
of renames with executors, and function preservation of tools."""

import dataclasses
import re

import numpy as np
import pytest

import data
from hat_jax import chat_format, hsa, livestream
from hat_jax import harness as hx

DIMS = list(hsa.Dim)


def rendered(
    state: hx.HarnessState, world: livestream.World, text: str = "how much is the serum?"
) -> str:
    """The first prompt the policy sees: system turn (with tool schemas) and the user turn."""
    request = world.make_request(hx.Comment(text=text, viewer_id="v1001", handle="lily"))
    messages = [
        {"role": "system", "content": hx.build_system_prompt(state, request)},
        {"role": "user", "content": hx.build_user_message(state, request)},
    ]
    return chat_format.render(messages, hx.tool_schemas(state), add_generation_prompt=True)


def test_same_seed_same_state_and_different_seeds_differ(base):
    a = hsa.augment(base, seed=11)
    b = hsa.augment(base, seed=11)
    c = hsa.augment(base, seed=12)
    assert a.harness.version == b.harness.version and a.renames == b.renames
    assert c.harness.version != a.harness.version
    assert not hx.validate(a.harness, a.renames)


def test_strength_zero_or_no_dims_is_identity(base):
    assert hsa.augment(base, seed=3, strength=0.0).harness is base
    assert hsa.augment(base, seed=3, dims="none").harness is base
    with pytest.raises(ValueError, match="strength"):
        hsa.augment(base, seed=3, strength=1.5)
    with pytest.raises(ValueError, match="unknown HSA dimension 'tools'"):
        hsa.augment(base, seed=3, dims="tools")


@pytest.mark.parametrize("dim", DIMS, ids=[d.value for d in DIMS])
def test_each_dimension_alone_changes_only_what_it_owns(base, world, dim):
    for seed in range(6):
        state = hsa.augment(base, seed=seed, dims={dim})
        changed = {d for d, what in hsa.changes(base, state).items() if what}
        assert changed == {dim}, (seed, hsa.changes(base, state))


@pytest.mark.parametrize("dim", [d for d in DIMS if d != hsa.Dim.SKILL_CONTENT])
def test_each_dimension_alone_changes_the_first_prompt(base, world, dim):
    # Skill content is read only once a Skill is loaded; tests/rl/sim covers that round.
    before = rendered(hx.HarnessState(harness=base), world)
    for seed in range(6):
        assert rendered(hsa.augment(base, seed=seed, dims={dim}), world) != before


def test_switching_a_dimension_does_not_change_what_another_draws(base):
    alone = hsa.augment(base, seed=5, dims={hsa.Dim.SYSTEM_PROMPT})
    both = hsa.augment(base, seed=5, dims={hsa.Dim.SYSTEM_PROMPT, hsa.Dim.HOOK})
    assert alone.harness.prompt.blocks == both.harness.prompt.blocks
    assert alone.harness.prompt.constraints == both.harness.prompt.constraints


def test_renames_are_consistent_and_reach_executors_only_by_surface_name(base, world):
    state = hsa.augment(base, seed=2, dims={hsa.Dim.TOOL_DEF}, strength=1.0)
    price = state.surface_tool("get_price_promotion")
    assert price != "get_price_promotion" and state.resolve_tool(price) == "get_price_promotion"
    assert state.resolve_tool("get_price_promotion") is None  # the old name is unknown
    # Skills authorise tools under their new names, and rules mention the new names.
    qa = state.harness.skill("product-qa")
    assert price in qa.allowed_tools and "get_price_promotion" not in qa.allowed_tools
    assert f"{{tool:{price}}}" in " ".join(r.text for r in qa.rules)

    calls = []
    tools = hx.Toolbox(
        {"get_price_promotion": lambda a: calls.append(a) or world.price_info(a["product_id"])}
    )
    load = state.surface_tool("load_skill")
    policy = hx.ScriptedPolicy(
        [
            hx.AssistantTurn(
                tool_calls=(
                    hx.call(load, name="product-qa"),
                    hx.call("get_price_promotion", product_id="BT-001"),
                    hx.call(price, product_id="BT-001"),
                )
            ),
            hx.AssistantTurn(
                tool_calls=(hx.call(state.surface_tool("reply_public"), text="¥149 tonight!"),)
            ),
        ]
    )
    traj = hx.run_agent(state, world.make_request("how much?"), policy, tools)
    old, new = traj.tool_calls[1], traj.tool_calls[2]
    assert old.canonical is None and old.error == "unknown_tool"
    assert new.canonical == "get_price_promotion" and new.error is None
    assert calls == [{"product_id": "BT-001"}]  # only the surface-name call was executed


def test_skill_mentions_follow_renames(base):
    """negative-feedback mentions after-sales in plain text; after a rename it names the new one."""
    for seed in range(20):
        state = hsa.augment(base, seed=seed, dims={hsa.Dim.SKILL_ID}, strength=1.0)
        new = state.surface_skill("after-sales")
        nf = state.surface_skill("negative-feedback")
        if new and nf and new != "after-sales":
            index = hx.render_text(state.harness.skill(nf).description, state)
            assert new in index and "after-sales" not in index
            return
    pytest.fail("no draw renamed after-sales while keeping negative-feedback")


def strip(schema):
    """A schema without descriptions: what a tool does."""
    if isinstance(schema, dict):
        return {k: strip(v) for k, v in schema.items() if k != "description"}
    return schema


def test_tools_keep_their_function(base):
    for seed in range(10):
        state = hsa.augment(base, seed=seed, strength=1.0)
        for t in state.harness.tools:
            old = base.tool(state.renames.canonical_tool(t.name))
            assert strip(hx.thaw(t.parameters)) == strip(hx.thaw(old.parameters))
            assert (t.category, t.provider, t.side_effects, t.context_args) == (
                old.category,
                old.provider,
                old.side_effects,
                old.context_args,
            )


def test_constraints_move_within_valid_ranges(base):
    seen = {c.name: set() for c in base.prompt.constraints}
    for seed in range(30):
        state = hsa.augment(base, seed=seed, dims={hsa.Dim.SYSTEM_PROMPT}, strength=0.8)
        for c in state.harness.prompt.constraints:
            assert c.min <= c.value <= c.max
            seen[c.name].add(c.value)
    assert all(len(values) > 1 for values in seen.values()), seen


def test_preserve_keeps_what_the_task_needs(base):
    preserve = hsa.Preserve(
        skills={"after-sales", "negative-feedback"},
        rules={"product-qa#5", "after-sales#5"},
        min_rounds=3,
        min_reply_chars=180,
        min_reply_sentences=3,
        retry_hooks={"reply_length", "require_reply_skill"},
    )
    for seed in range(40):
        s = hsa.augment(base, seed=seed, strength=1.0, preserve=preserve)
        for canonical in preserve.skills:
            assert s.surface_skill(canonical) is not None
        rules = {r.id for sk in s.harness.skills for r in sk.rules}
        assert {"product-qa#5", "after-sales#5"} <= rules
        critical = {r.id for sk in base.skills for r in sk.rules if r.critical}
        kept = {s.renames.canonical_skill(sk.name) for sk in s.harness.skills}
        assert {r for r in critical if r.split("#")[0] in kept} <= rules
        p = s.harness.prompt
        assert p.constraint("max_rounds") >= 3 and p.constraint("reply_max_chars") >= 180
        assert p.constraint("reply_max_sentences") >= 3
        for name in preserve.retry_hooks:
            rule = s.harness.hooks.rule(name)
            assert rule.action == "retry" and rule.max_retries >= 1
        assert s.harness.hooks.max_total_retries >= 1
        assert any(sk.kind == "reply" for sk in s.harness.skills)


def test_masking_never_removes_the_last_skill_for_a_gated_tool(base):
    for seed in range(40):
        s = hsa.augment(base, seed=seed, dims={hsa.Dim.SKILL_ID}, strength=1.0)
        allowed = {t for sk in s.harness.skills for t in sk.allowed_tools}
        gated = [t.name for t in s.harness.tools if t.category in ("commerce", "marketing")]
        assert set(gated) <= allowed


def test_synthetic_skills_are_new_names_that_authorise_no_action(base):
    added = set()
    for seed in range(30):
        s = hsa.augment(base, seed=seed, dims={hsa.Dim.SKILL_ID}, strength=1.0)
        for sk in s.harness.skills:
            if s.renames.canonical_skill(sk.name) not in base.skill_names:
                added.add(sk.name)
                assert sk.name not in base.skill_names
                kinds = {s.harness.tool(t).category for t in sk.allowed_tools}
                assert kinds <= {"retrieval"}
    assert added & {x.name for x in hsa.default_bank().synthetic if x.noise}
    assert added & {x.name for x in hsa.default_bank().synthetic if not x.noise}


def test_impossible_needs_fail_clearly(base):
    with pytest.raises(hsa.PreserveError, match=r"reply_max_chars >= 400.*\[120, 300\]"):
        hsa.augment(base, seed=0, preserve=hsa.Preserve(min_reply_chars=400))
    with pytest.raises(hsa.PreserveError, match="Skills the task needs"):
        hsa.augment(base, seed=0, dims="hook", preserve=hsa.Preserve(skills={"no-such-skill"}))


def test_check_predicate_redraws_until_it_holds(base):
    seen = []

    def check(state):
        seen.append(state.harness.version)
        return len(seen) >= 3

    state = hsa.augment(base, seed=1, preserve=hsa.Preserve(check=check))
    assert state.harness.version == seen[-1] and len(set(seen)) == 3
    with pytest.raises(hsa.HsaError, match="no augmentation in 4 draws"):
        hsa.augment(base, seed=1, preserve=hsa.Preserve(check=lambda s: False), max_tries=4)


def test_hook_variants_stay_within_supported_actions(base):
    actions = {}
    for seed in range(40):
        s = hsa.augment(base, seed=seed, dims={hsa.Dim.HOOK}, strength=1.0)
        assert not hx.validate(s.harness)
        for rule in s.harness.hooks.hooks:
            assert rule.enabled
            actions.setdefault(rule.name, set()).add(rule.action)
    for name, options in hsa.FLIPPABLE.items():
        assert actions[name] == set(options), name


def test_augmenting_a_variant_composes_renames(base):
    first = hsa.augment(base, seed=1, dims={hsa.Dim.TOOL_DEF}, strength=1.0)
    second = hsa.augment(first, seed=2, dims={hsa.Dim.TOOL_DEF}, strength=1.0)
    assert set(second.canonical_tools) == set(base.tool_names)
    for name in second.harness.tool_names:
        assert second.renames.canonical_tool(name) in base.tool_names


def test_release_tag_records_dims_and_seed(base):
    s = hsa.augment(base, seed=9, dims={hsa.Dim.HOOK, hsa.Dim.TOOL_DEF})
    assert s.harness.release.startswith(f"{base.release}+hsa.") and s.harness.release.endswith(".9")
    assert dataclasses.replace(s.harness, release=base.release).version != base.version


def test_batched_renames_equal_one_by_one_renames(base):
    for seed in range(8):
        varied = hsa.augment(base, seed=seed, dims={hsa.Dim.SKILL_ID, hsa.Dim.SKILL_CONTENT})
        start = hx.HarnessState(harness=varied.harness)  # synthetic Skills included
        tools = {n: f"{n}_v{seed}" for n in start.harness.tool_names[seed % 3 :: 2]}
        skills = {n: f"{n}-v{seed}" for n in start.harness.skill_names[:: 1 + seed % 2]}
        one_by_one = start
        for old, new in tools.items():
            one_by_one = one_by_one.rename_tool(old, new)
        for old, new in skills.items():
            one_by_one = one_by_one.rename_skill(old, new)
        batched = hsa.rename_all(start, tools=tools, skills=skills)
        assert batched.harness == one_by_one.harness and batched.renames == one_by_one.renames
    with pytest.raises(ValueError, match="that name is taken"):
        hsa.rename_all(start, tools={"check_inventory": "search_faq"})
    with pytest.raises(KeyError, match="no skill named"):
        hsa.rename_all(start, skills={"nope": "x"})


@pytest.mark.slow
def test_same_seed_same_state_in_another_process(base):
    """String hashing differs between processes; the draw must not depend on it."""
    import os
    import subprocess
    import sys

    code = (
        "from hat_jax import harness as hx, hsa, livestream\n"
        "b = hx.load(livestream.default_world_dir())\n"
        "print(','.join(hsa.augment(b, seed=s, strength=1.0).harness.version for s in range(5)))"
    )
    outs = set()
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-1000:]
        outs.add(proc.stdout.strip())
    here = ",".join(hsa.augment(base, seed=s, strength=1.0).harness.version for s in range(5))
    assert outs == {here}


def test_augment_works_on_a_harness_the_bank_does_not_know(base):
    """An operator's new Skill and tool have no reviewed rewrites: they keep their wording,
    get opaque names when renamed, and the variant is still valid."""
    size = hx.Skill(
        name="size-advisor",
        description="Recommend a size from a viewer's height and weight.",
        kind="reply",
        version="1.0.0",
        allowed_tools=("get_product_detail",),
        rules=(
            hx.Rule(
                id="size-advisor#1", text="Read the size chart with {tool:get_product_detail}."
            ),
        ),
    )
    tool = dataclasses.replace(
        base.tool("search_faq"), name="size_chart", description="Size charts."
    )
    edited = dataclasses.replace(base, skills=(*base.skills, size), tools=(*base.tools, tool))
    assert not hx.validate(edited)
    for seed in range(10):
        s = hsa.augment(
            edited, seed=seed, strength=1.0, preserve=hsa.Preserve(skills={"size-advisor"})
        )
        assert not hx.validate(s.harness, s.renames)
        new = s.harness.skill(s.surface_skill("size-advisor"))
        assert new.description == size.description
        assert s.surface_tool("size_chart") is not None


OPAQUE_TOOL, OPAQUE_SKILL = r"tool_[0-9a-f]{4}x*", r"skill-[0-9a-f]{4}x*"


def _opaque(state: hx.HarnessState) -> tuple[list[bool], list[bool]]:
    tools = [bool(re.fullmatch(OPAQUE_TOOL, n)) for n in state.renames.tools]
    skills = [bool(re.fullmatch(OPAQUE_SKILL, n)) for n in state.renames.skills]
    return tools, skills


def test_opaque_names_sets_the_share_of_renames_that_must_be_copied(base):
    """`opaque_names=1`: every rename is an opaque name (nothing a policy could memorise);
    `0`: every rename comes from the bank (this Harness's modules all have bank names left);
    the default draws some of each. Each variant stays valid, and is a function of its
    arguments."""
    counts = {}
    for opaque in (None, 0.0, 1.0):
        tools, skills = [], []
        for seed in range(8):
            state = hsa.augment(base, seed=seed, strength=1.0, opaque_names=opaque)
            assert not hx.validate(state.harness, state.renames)
            again = hsa.augment(base, seed=seed, strength=1.0, opaque_names=opaque)
            assert again.renames == state.renames
            t, s = _opaque(state)
            tools, skills = tools + t, skills + s
        assert tools and skills
        counts[opaque] = (sum(tools) / len(tools), sum(skills) / len(skills))
    assert counts[1.0] == (1.0, 1.0)
    assert counts[0.0] == (0.0, 0.0)
    assert 0.0 < counts[None][0] < 0.5, counts  # 0.15 x strength of the tool renames
    with pytest.raises(ValueError, match="opaque_names must be in"):
        hsa.augment(base, seed=3, opaque_names=1.5)


def test_online_hsa_passes_opaque_names_to_its_draws():
    draw = data.make_augmenter(data.OnlineHSAConfig(probability=1.0, opaque_names=1.0))
    rng = np.random.default_rng(0)
    for _ in range(4):
        tools, skills = _opaque(draw(rng, frozenset()))
        assert tools and all(tools) and all(skills)
    with pytest.raises(ValueError, match="opaque_names must be in"):
        data.OnlineHSAConfig(probability=1.0, opaque_names=-0.5)
