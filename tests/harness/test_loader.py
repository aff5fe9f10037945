"""Loading Harness v0, immutability and content versioning, validation errors that name the
file and the field, and plain Agent Skills folders (only name and description)."""

import dataclasses
import json
import pickle
import shutil

import pytest
import yaml

from hat_jax import harness as hx


def test_harness_v0_inventory(harness):
    kinds = [s.kind for s in harness.skills]
    assert kinds.count("reply") >= 4 and kinds.count("strategy") >= 4
    assert {"product-qa", "after-sales", "chit-chat", "general-reply"} <= set(harness.skill_names)
    assert {"coupon-marketing", "purchase-guidance", "negative-feedback", "multi-intent"} <= set(
        harness.skill_names
    )
    by_category = {}
    for t in harness.tools:
        by_category.setdefault(t.category, set()).add(t.name)
    assert by_category["retrieval"] == {"search_products", "get_product_detail", "search_faq"}
    assert by_category["commerce"] == {
        "check_inventory",
        "get_price_promotion",
        "get_order_status",
        "get_after_sales_policy",
    }
    assert by_category["flow"] == set(hx.FLOW_TOOLS)
    assert by_category["marketing"] == {"issue_coupon", "get_lottery_status", "claim_follow_gift"}
    assert all(t.provider == "mcp:marketing" for t in harness.tools if t.category == "marketing")
    skill = harness.skill("product-qa")
    assert skill.rules[0].id == "product-qa#1" and skill.rules[0].critical
    assert "get_price_promotion" in skill.allowed_tools
    assert [b.id for b in harness.prompt.blocks] == [
        "role",
        "global_rules",
        "skill_index",
        "product_spec",
        "faqs",
        "room_state",
        "history",
    ]
    c = {c.name: c for c in harness.prompt.constraints}
    assert c["reply_max_chars"].min <= c["reply_max_chars"].value <= c["reply_max_chars"].max
    assert c["max_rounds"].value == 4


def test_harness_is_frozen_and_versioned_by_content(harness, world_dir, tmp_path):
    with pytest.raises(dataclasses.FrozenInstanceError):
        harness.name = "x"
    with pytest.raises(TypeError, match="immutable"):
        harness.tool("check_inventory").parameters["properties"]["x"] = 1
    again = hx.load(world_dir)
    assert again.version == harness.version and again == harness and hash(again) == hash(harness)
    moved = tmp_path / "elsewhere"
    shutil.copytree(world_dir / "harness", moved)
    assert hx.load(moved).version == harness.version  # where it lives is not content
    edited = dataclasses.replace(
        harness, prompt=harness.prompt.with_constraint("reply_max_chars", 150)
    )
    assert edited.version != harness.version
    restored = pickle.loads(pickle.dumps(edited))
    assert restored == edited and restored.version == edited.version


def test_manifest_lists_every_module(harness):
    rows = harness.manifest()
    kinds = {(r.kind, r.name) for r in rows}
    assert {("skill", s.name) for s in harness.skills} <= kinds
    assert {("tool", t.name) for t in harness.tools} <= kinds
    assert ("prompt", "system-prompt") in kinds and ("hooks", "hooks") in kinds
    assert all(len(r.hash) == 64 and r.version for r in rows)


def _problems(path) -> list[hx.Problem]:
    with pytest.raises(hx.HarnessError) as err:
        hx.load(path)
    return list(err.value.problems)


def _edit_skill(root, name, old, new):
    path = root / "skills" / name / "SKILL.md"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_bad_yaml_names_the_skill_file_and_line(harness_copy):
    _edit_skill(
        harness_copy, "chit-chat", "metadata:\n  version: 1.0.0", "metadata:\n  version: [1.0.0"
    )
    (p,) = _problems(harness_copy)
    assert p.file == "skills/chit-chat/SKILL.md" and p.field == "<yaml>"
    assert "line 8" in p.message


def test_skill_naming_unknown_tool(harness_copy):
    _edit_skill(
        harness_copy,
        "chit-chat",
        "allowed-tools: search_faq",
        "allowed-tools: search_faq summon_dragon",
    )
    (p,) = _problems(harness_copy)
    assert (p.file, p.field) == ("skills/chit-chat/SKILL.md", "allowed-tools")
    assert "summon_dragon" in p.message


def test_duplicate_tool_names_and_invalid_schema(harness_copy):
    data = json.loads((harness_copy / "tools.json").read_text())
    data["tools"].append(dict(data["tools"][0]))
    data["tools"][1]["parameters"]["properties"]["product_id"]["type"] = "strng"
    (harness_copy / "tools.json").write_text(json.dumps(data))
    problems = _problems(harness_copy)
    fields = {(p.file, p.field) for p in problems}
    assert ("tools.json", "tools[14].name") in fields
    schema = [p for p in problems if (p.file, p.field) == ("tools.json", "tools[1].parameters")]
    assert schema and "not a valid JSON Schema" in schema[0].message


def test_duplicate_skill_names(harness_copy):
    shutil.copytree(harness_copy / "skills" / "chit-chat", harness_copy / "skills" / "chit-chat-2")
    problems = _problems(harness_copy)
    assert {(p.file, p.field) for p in problems} == {("skills/chit-chat-2/SKILL.md", "name")}


def test_many_problems_reported_at_once(harness_copy):
    _edit_skill(harness_copy, "general-reply", "kind: reply", "kind: fallback")
    _edit_skill(harness_copy, "multi-intent", "1. List every question", "7. List every question")
    _edit_skill(harness_copy, "after-sales", "name: after-sales", "name: aftersales")
    prompt = yaml.safe_load((harness_copy / "prompt.yaml").read_text())
    prompt["constraints"][0]["value"] = 999
    prompt["blocks"][1]["items"].append("Call {tool:teleport} now.")
    (harness_copy / "prompt.yaml").write_text(yaml.safe_dump(prompt))
    hooks = yaml.safe_load((harness_copy / "hooks.yaml").read_text())
    hooks["hooks"][0]["point"] = "before_reply"
    hooks["hooks"].append({"name": "mind_reader", "point": "input", "action": "flag"})
    hooks["hooks"][1]["params"]["patterns"]["en"].append("([unclosed")
    (harness_copy / "hooks.yaml").write_text(yaml.safe_dump(hooks))
    fields = {(p.file, p.field) for p in _problems(harness_copy)}
    assert ("skills/general-reply/SKILL.md", "metadata.kind") in fields
    assert ("skills/multi-intent/SKILL.md", "body") in fields
    assert ("skills/after-sales/SKILL.md", "name") in fields
    assert ("prompt.yaml", "constraints[0].value") in fields


def test_cross_module_problems(harness_copy):
    prompt = yaml.safe_load((harness_copy / "prompt.yaml").read_text())
    prompt["blocks"][1]["items"].append("Call {tool:teleport} now.")
    (harness_copy / "prompt.yaml").write_text(yaml.safe_dump(prompt))
    hooks = yaml.safe_load((harness_copy / "hooks.yaml").read_text())
    hooks["hooks"][0]["point"] = "before_reply"
    hooks["hooks"].append({"name": "mind_reader", "point": "input", "action": "flag"})
    english = hooks["hooks"][1]["params"]["patterns"]["en"]
    english.append("([unclosed")
    (harness_copy / "hooks.yaml").write_text(yaml.safe_dump(hooks))
    problems = _problems(harness_copy)
    fields = {(p.file, p.field) for p in problems}
    assert ("prompt.yaml", "blocks[1].items[7]") in fields
    assert ("hooks.yaml", "hooks[0].point") in fields
    assert ("hooks.yaml", "hooks[15].name") in fields
    assert ("hooks.yaml", f"hooks[1].params.patterns.en[{len(english) - 1}]") in fields


def test_missing_file_and_bad_json(harness_copy):
    (harness_copy / "hooks.yaml").unlink()
    (harness_copy / "tools.json").write_text('{"tools": [')
    problems = _problems(harness_copy)
    assert {(p.file, p.field) for p in problems} >= {
        ("hooks.yaml", "<file>"),
        ("tools.json", "<json>"),
    }


def test_validate_derived_harness(harness):
    skill = harness.skill("chit-chat")
    bad = dataclasses.replace(skill, allowed_tools=("search_faq", "nope"))
    variant = dataclasses.replace(
        harness, skills=tuple(bad if s.name == "chit-chat" else s for s in harness.skills)
    )
    assert [(p.field, "nope" in p.message) for p in hx.validate(variant)] == [
        ("allowed-tools", True)
    ]
    assert hx.validate(harness) == []
    no_reply = dataclasses.replace(
        harness, tools=tuple(t for t in harness.tools if t.name != "no_reply")
    )
    assert any("no_reply" in p.message for p in hx.validate(no_reply))
    with pytest.raises(ValueError, match="outside"):
        harness.prompt.with_constraint("max_rounds", 9)


_PLAIN_FRONT_MATTER = {
    "name": "size-advice",
    "description": "Suggest one size from the viewer's height and weight. Use it when a "
    "comment asks which size to buy.",
}


def _add_plain_skill(root, front_matter) -> None:
    """An Agent Skills folder: SKILL.md with only the given front matter, a Markdown body
    without numbered rules, and another file beside it."""
    folder = root / "skills" / "size-advice"
    folder.mkdir()
    body = (
        "# Size advice\n\nAsk for height and weight when the comment gives neither.\n"
        "Then suggest one size and say why, in one sentence.\n"
    )
    (folder / "SKILL.md").write_text(f"---\n{yaml.safe_dump(front_matter)}---\n{body}")
    (folder / "reference.md").write_text("Size chart.\n")


def test_plain_agent_skill_folder_loads_with_the_defaults(harness_copy):
    _add_plain_skill(harness_copy, _PLAIN_FRONT_MATTER)
    harness = hx.load(harness_copy)
    skill = harness.skill("size-advice")
    assert skill.description == _PLAIN_FRONT_MATTER["description"]
    assert (skill.kind, skill.version, skill.allowed_tools, skill.rules) == (
        "strategy",
        "1.0.0",
        (),
        (),
    )
    assert skill.title == "Size advice" and skill.source == "skills/size-advice/SKILL.md"
    assert skill.intro.startswith("Ask for height") and skill.intro.endswith("in one sentence.")
    rendered = hx.render_skill(hx.HarnessState(harness=harness), skill)
    assert "Skill size-advice loaded (strategy)." in rendered and "Ask for height" in rendered


@pytest.mark.parametrize("field", ["name", "description"])
def test_plain_skill_without_name_or_description_names_the_file(harness_copy, field):
    _add_plain_skill(harness_copy, {k: v for k, v in _PLAIN_FRONT_MATTER.items() if k != field})
    with pytest.raises(hx.HarnessError, match=rf"skills/size-advice/SKILL.md: {field}: missing"):
        hx.load(harness_copy)
