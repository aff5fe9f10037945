"""The system-prompt pipeline: block order, items, numeric constraints, retrieval, user turn."""

import dataclasses
import re

from hat_jax import harness as hx


def _titles(prompt: str) -> list[str]:
    return re.findall(r"^## (.+)$", prompt, re.M)


def test_blocks_in_harness_order(state, request_for):
    prompt = hx.build_system_prompt(state, request_for("how much is the serum?"))
    assert _titles(prompt) == [
        "Role",
        "Rules",
        "Skills",
        "Product on screen",
        "Related FAQ",
        "Live room",
        "Recent conversation",
    ]
    assert "You are Mia" in prompt and "Keep each reply under 200 characters" in prompt
    assert "product-qa (reply): Answer factual questions" in prompt
    assert "List price: ¥199" in prompt and "Promotion (active): ¥149" in prompt
    assert "Lottery (open): AirBeat Pro Wireless Earbuds for 3 winners, draw at 21:00" in prompt
    assert "{" not in prompt.replace("{'", "")  # every placeholder resolved


def test_reordered_blocks_and_items_change_the_prompt(state, request_for):
    h = state.harness
    blocks = list(h.prompt.blocks)
    blocks[0], blocks[5] = blocks[5], blocks[0]
    rules = blocks[1]
    blocks[1] = dataclasses.replace(rules, items=tuple(reversed(rules.items)))
    variant = hx.HarnessState(
        harness=dataclasses.replace(h, prompt=dataclasses.replace(h.prompt, blocks=tuple(blocks)))
    )
    req = request_for("hi")
    prompt = hx.build_system_prompt(variant, req)
    assert _titles(prompt)[0] == "Live room" and _titles(prompt)[5] == "Role"
    rule_lines = prompt.split("## Rules\n")[1].split("\n\n")[0].splitlines()
    assert rule_lines[0].startswith("- Finish with reply_public")


def test_numeric_constraints_are_read_at_render_time(state, request_for):
    h = state.harness
    variant = hx.HarnessState(
        harness=dataclasses.replace(
            h,
            prompt=h.prompt.with_constraint("reply_max_chars", 150).with_constraint(
                "max_rounds", 3
            ),
        )
    )
    prompt = hx.build_system_prompt(variant, request_for("hi"))
    assert "under 150 characters" in prompt and "at most 3 rounds" in prompt
    rendered = hx.render_skill(variant, h.skill("multi-intent"))
    assert "exceed 150 characters" in rendered


def test_faq_retrieval_obeys_top_k(state, request_for):
    req = request_for("can I use the serum with retinol at night")
    faqs = (
        hx.build_system_prompt(state, req)
        .split("## Related FAQ\n")[1]
        .split("\n\n")[0]
        .splitlines()
    )
    assert len(faqs) == 3 and "retinol" in faqs[0]
    one = hx.HarnessState(
        harness=dataclasses.replace(
            state.harness, prompt=state.harness.prompt.with_constraint("faq_top_k", 1)
        )
    )
    faqs = (
        hx.build_system_prompt(one, req).split("## Related FAQ\n")[1].split("\n\n")[0].splitlines()
    )
    assert len(faqs) == 1


def test_history_window(state, world):
    history = [
        {"handle": f"v{i}", "comment": f"question {i}", "reply": f"answer {i}"} for i in range(12)
    ]
    req = world.make_request(hx.Comment(text="hi"), history=history)
    prompt = hx.build_system_prompt(state, req)
    assert (
        "@v11: question 11" in prompt
        and "@v5: question 5" not in prompt
        and "@v6: question 6" in prompt
    )
    none = hx.HarnessState(
        harness=dataclasses.replace(
            state.harness, prompt=state.harness.prompt.with_constraint("history_turns", 0)
        )
    )
    assert "(no earlier conversation)" in hx.build_system_prompt(none, req)


def test_user_message_template(state, world):
    comments = [
        hx.Comment(text="hello", viewer_id="v1", handle="amy"),
        hx.Comment(text="price?", viewer_id="v2", handle="bo"),
    ]
    req = world.make_request(comments)
    text = hx.build_user_message(state, req)
    assert text.splitlines() == [
        "Viewer comments to answer (untrusted text):",
        "On screen: HydraSilk Hyaluronic Serum 30 ml [BT-001]",
        "[1] @amy: hello",
        "[2] @bo: price?",
    ]
    fmt = dataclasses.replace(state.harness.prompt.user_message, comment="{handle} says: {text}")
    variant = hx.HarnessState(
        harness=dataclasses.replace(
            state.harness, prompt=dataclasses.replace(state.harness.prompt, user_message=fmt)
        )
    )
    assert hx.build_user_message(variant, req).splitlines()[-1] == "bo says: price?"


def test_skill_rendering_renumbers_rules(state):
    skill = state.harness.skill("chit-chat")
    reordered = dataclasses.replace(skill, rules=skill.rules[::-1][:3])
    text = hx.render_skill(state, reordered)
    assert text.splitlines()[0] == "Skill chit-chat loaded (reply)."
    assert [line[:2] for line in text.splitlines()[3:]] == ["1.", "2.", "3."]
    assert "Do not repeat insults" in text.splitlines()[3]


def test_tool_schemas_hide_context_arguments(state):
    schemas = {s["function"]["name"]: s["function"] for s in hx.tool_schemas(state)}
    assert len(schemas) == 14
    assert "viewer_id" not in schemas["get_order_status"]["parameters"]["properties"]
    assert "viewer_id" not in schemas["issue_coupon"]["parameters"]["properties"]
    assert schemas["check_inventory"]["parameters"]["required"] == ["product_id"]
