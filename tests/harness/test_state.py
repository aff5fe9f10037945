"""HarnessState and RenameMap: consistent renames, one resolution point, canonical executors."""

import dataclasses

import pytest

from hat_jax import harness as hx
from hat_jax import livestream
from tests.harness._helpers import turn


def test_rename_tool_rewrites_every_reference(state, request_for):
    variant = state.rename_tool("get_price_promotion", "quote_price")
    h = variant.harness
    assert h.tool("get_price_promotion") is None and h.tool("quote_price").category == "commerce"
    assert "quote_price" in h.skill("product-qa").allowed_tools
    assert "quote_price" in hx.render_skill(variant, h.skill("product-qa"))
    assert "get_price_promotion" not in hx.render_skill(variant, h.skill("product-qa"))
    assert hx.validate(h, variant.renames) == []
    assert variant.resolve_tool("quote_price") == "get_price_promotion"
    assert variant.resolve_tool("get_price_promotion") is None
    assert variant.surface_tool("get_price_promotion") == "quote_price"
    assert variant.renames.to_dict() == {
        "tools": {"quote_price": "get_price_promotion"},
        "skills": {},
    }
    names = [t["function"]["name"] for t in hx.tool_schemas(variant)]
    assert "quote_price" in names and "get_price_promotion" not in names
    flow = state.rename_tool("load_skill", "open_playbook")
    prompt = hx.build_system_prompt(flow, request_for("hi"))
    assert "open_playbook" in prompt and "load_skill" not in prompt


def test_renames_compose_and_undo(state):
    twice = state.rename_tool("load_skill", "open_playbook").rename_tool(
        "open_playbook", "use_skill"
    )
    assert twice.renames.tools == {"use_skill": "load_skill"}
    assert (
        twice.resolve_tool("use_skill") == "load_skill"
        and twice.resolve_tool("open_playbook") is None
    )
    undone = twice.rename_tool("use_skill", "load_skill")
    assert undone.renames.tools == {} and undone.harness == state.harness


def test_rename_skill(state):
    variant = state.rename_skill("product-qa", "item-questions")
    assert variant.harness.skill("item-questions").kind == "reply"
    assert variant.resolve_skill("item-questions") == "product-qa"
    assert variant.resolve_skill("product-qa") is None
    assert variant.surface_skill("product-qa") == "item-questions"


def test_rename_errors(state):
    with pytest.raises(KeyError, match="no tool named 'nope'"):
        state.rename_tool("nope", "x")
    with pytest.raises(ValueError, match="taken"):
        state.rename_tool("search_faq", "search_products")
    with pytest.raises(ValueError, match="invalid tool name"):
        state.rename_tool("search_faq", "search faq")
    with pytest.raises(ValueError, match="two surface names"):
        hx.RenameMap(tools={"a": "x", "b": "x"})


def test_old_name_is_an_unknown_tool_and_executors_see_canonical_names(state, spy, request_for):
    variant = state.rename_tool("get_price_promotion", "quote_price")
    policy = hx.ScriptedPolicy(
        [
            turn(
                hx.call("load_skill", name="product-qa"),
                hx.call("get_price_promotion", product_id="BT-001"),
            ),
            turn(hx.call("quote_price", product_id="BT-001")),
            turn(hx.call("reply_public", text="The serum is ¥149 tonight.")),
        ]
    )
    traj = hx.run_agent(variant, request_for("how much?"), policy, spy.toolbox)
    old, new = traj.tool_calls[1], traj.tool_calls[2]
    assert (old.name, old.canonical, old.error) == ("get_price_promotion", None, "unknown_tool")
    assert (new.name, new.canonical, new.error) == ("quote_price", "get_price_promotion", None)
    assert spy.names() == ["get_price_promotion"]  # called once, under its canonical name
    assert traj.spoken == "The serum is ¥149 tonight."
    assert traj.renames["tools"] == {"quote_price": "get_price_promotion"}


def test_rule_policy_speaks_the_variant_names(state, world, tools, request_for):
    variant = state.rename_tool("check_inventory", "stock_level").rename_skill(
        "product-qa", "item-answers"
    )
    req = request_for("is the serum in stock?")
    base = hx.run_agent(state, req, livestream.RuleBasedPolicy(state, world), tools)
    renamed = hx.run_agent(variant, req, livestream.RuleBasedPolicy(variant, world), tools)
    assert renamed.spoken == base.spoken and not renamed.final.fallback
    assert "item-answers" in renamed.loaded_skills
    assert [r.name for r in renamed.tool_calls if r.canonical == "check_inventory"] == [
        "stock_level"
    ]


def test_harness_copy_with_changes(harness):
    blocks = tuple(reversed(harness.prompt.blocks))
    variant = dataclasses.replace(
        harness, prompt=dataclasses.replace(harness.prompt, blocks=blocks)
    )
    assert variant.version != harness.version and hx.validate(variant) == []
    assert hx.as_state(variant).harness is variant
    with pytest.raises(TypeError):
        hx.as_state("not a harness")
