"""Harness edits (`hat_jax.harness.load_edit` / `apply_edit`): the bundled candidates apply to
Harness v0 and change only what they name; bad edits are refused with the file and field
named; the edited Harness validates (placeholders included) and has a new version."""

import pathlib

import pytest
import yaml

from hat_jax import harness as hx
from hat_jax import livestream

EDITS = pathlib.Path(__file__).resolve().parents[2] / "data" / "livestream" / "harness_edits"


@pytest.fixture(scope="module")
def released() -> hx.Harness:
    return hx.load(livestream.default_world_dir())


@pytest.mark.parametrize("path", sorted(EDITS.glob("*.yaml")), ids=lambda p: p.stem)
def test_a_bundled_edit_changes_only_what_it_names(released, path):
    edit = hx.load_edit(path)
    edited = hx.apply_edit(released, edit)
    assert edited.version != released.version and not hx.validate(edited)
    assert edited.tools == released.tools and edited.hooks == released.hooks
    blocks = {b.id: b for b in edited.prompt.blocks}
    for block in released.prompt.blocks:
        part = next((p for p in edit.prompt if p.target == block.id), None)
        if part is None:
            assert blocks[block.id] == block
            continue
        assert blocks[block.id].items[len(block.items) :] == part.add  # appended, in order
        for old, new in part.replace:
            assert not any(old in i for i in blocks[block.id].items)
            assert any(new in i for i in blocks[block.id].items)
    for skill in released.skills:
        part = next((p for p in edit.skills if p.target == skill.name), None)
        after = edited.skill(skill.name)
        if part is None:
            assert after == skill
            continue
        added = after.rules[len(skill.rules) :]
        assert tuple(r.text for r in added) == part.add
        assert [r.id for r in added] == [f"{skill.name}#{len(skill.rules) + i + 1}"
                                         for i in range(len(added))]  # fmt: skip
        for old, new in part.replace:
            assert any(new in r.text for r in after.rules)
            assert not any(old in r.text for r in after.rules)
    assert edit.digest == hx.load_edit(path).digest and len(edit.digest) == 16


def test_the_digest_is_the_content_not_the_file(tmp_path):
    data = {"name": "x", "skills": [{"skill": "chit-chat", "add": ["Smile."]}]}
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(data))
    b.write_text(yaml.safe_dump(data))
    assert hx.load_edit(a).digest == hx.load_edit(b).digest
    data["skills"][0]["add"] = ["Smile twice."]
    assert hx.parse_edit(data).digest != hx.load_edit(a).digest


@pytest.mark.parametrize(
    "data, message",
    [
        ({"skills": [{"skill": "chit-chat", "add": ["x"]}]}, "name: missing"),
        ({"name": "x"}, "changes nothing"),
        ({"name": "x", "prompt": [{"block": "global_rules"}]}, "prompt[0]: changes nothing"),
        ({"name": "x", "prompt": {"block": "a"}}, "prompt: expected a list"),
        ({"name": "x", "skills": [{"add": ["y"]}]}, "skills[0]: expected a mapping with a 'skill'"),
        ({"name": "x", "skills": [{"skill": "a", "add": [""]}]}, "skills[0].add: expected a list"),
        ({"name": "x", "skills": [{"skill": "a", "replace": [{"old": ""}]}]}, "replace[0]"),
        ({"name": "x", "hooks": []}, "unknown field(s) ['hooks']"),
    ],
)
def test_a_malformed_edit_is_refused_by_field(data, message):
    with pytest.raises(hx.HarnessError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):  # fmt: skip
        hx.parse_edit(data, "bad.yaml")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"prompt": [{"block": "nope", "add": ["x"]}]}, "no prompt block 'nope'"),
        ({"skills": [{"skill": "nope", "add": ["x"]}]}, "no Skill 'nope'"),
        ({"skills": [{"skill": "chit-chat", "replace": [{"old": "zzz", "new": "y"}]}]},
         "no text holds 'zzz'"),
        ({"skills": [{"skill": "chit-chat", "add": ["Call {tool:nope} first."]}]},
         "placeholder {tool:nope} names an unknown tool"),
    ],
)  # fmt: skip
def test_an_edit_that_does_not_fit_the_harness_is_refused(released, data, message):
    edit = hx.parse_edit({"name": "x"} | data, "edit.yaml")
    with pytest.raises(hx.HarnessError, match="edit.yaml") as err:
        hx.apply_edit(released, edit)
    assert message in str(err.value)


def test_a_missing_or_broken_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.yaml: no such file"):
        hx.load_edit(tmp_path / "nowhere.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(hx.HarnessError, match="bad.yaml: <root>: not valid YAML"):
        hx.load_edit(bad)


def test_placeholders_in_added_text_render_under_renames(released):
    edit = hx.parse_edit({"name": "x", "skills": [{"skill": "product-qa", "add": [
        "Check stock with {tool:check_inventory} first."]}]})  # fmt: skip
    edited = hx.apply_edit(released, edit)
    state = hx.HarnessState(harness=edited).rename_tool("check_inventory", "stock_lookup")
    text = hx.render_skill(state, state.harness.skill("product-qa"))
    assert "Check stock with stock_lookup first." in text
