"""The live room reaches evaluation: the micro room's context, its T1/T2/T3 sets drawn from its
own scenario pool under its own Harness (T2's edits from the held-out bank), the scripted
teacher as the ceiling, the room recorded in sets, summaries and reports, and a set of one room
refused under the other."""

import collections
import json
import re

import pytest

from configs import eval_demo
from hat_jax import eval as hev
from hat_jax import harness as hx
from hat_jax import hsa
from hat_jax.eval import _qa_sets as qa
from hat_jax.eval._items import MANIFEST_FILE, read_set, write_set
from launch import eval as eval_launch
from rl import sim
from tests.eval.test_qa_sets import _OPAQUE, _name_key, bank_texts, surface_texts

SIZE = 13  # one item per scenario family


@pytest.fixture(scope="module")
def micro() -> hev.EvalContext:
    return hev.EvalContext.default("micro")


@pytest.fixture(scope="module")
def v0() -> hev.EvalContext:
    return hev.EvalContext.default()


@pytest.fixture(scope="module")
def pool() -> sim.ScenarioSet:
    return sim.default_scenarios("micro")


@pytest.fixture(scope="module")
def t1(micro):
    return qa.T1.build(micro, split="test", size=SIZE, seed=0)


@pytest.fixture(scope="module")
def t2(micro):
    return qa.T2.build(micro, split="test", size=SIZE, seed=0)


# ------------------------------------------------------------------------------ the context
def test_the_default_context_of_each_room(micro, v0):
    assert micro.room == "micro" and micro.harness.name == "livestream-micro"
    assert v0.room == "v0" and v0.harness.name == "livestream"
    assert micro.world.root == v0.world.root  # one world, two Harnesses
    assert micro.harness.version != v0.harness.version


def test_an_unknown_room_is_refused_by_name(v0):
    with pytest.raises(ValueError, match=r"unknown live room 'v9'.*\['v0', 'micro'\]"):
        hev.EvalContext.default("v9")
    with pytest.raises(ValueError, match=r"unknown live room 'v9'"):
        hev.EvalContext(world=v0.world, harness=v0.harness, room="v9")


# ------------------------------------------------------------------------------ the sets
def test_t1_and_t2_are_drawn_from_the_micro_pool(micro, pool, t1, t2):
    test_ids = {s.id for s in pool.split("test")}
    for eval_set in (t1, t2):
        assert eval_set.room == "micro" and eval_set.manifest()["room"] == "micro"
        assert len(eval_set) == SIZE
        assert collections.Counter(i.family for i in eval_set) == {f: 1 for f in sim.FAMILIES}
        for item in eval_set:
            assert item.id in test_ids and item.scenario["phrasing"].startswith("m-"), item.id
    assert {i.harness["base"] for i in t2} == {micro.harness.version}


@pytest.mark.parametrize("which", ["t1", "t2"])
def test_the_teacher_is_the_ceiling_in_the_micro_room(micro, t1, t2, which):
    kind, eval_set = (qa.T1, t1) if which == "t1" else (qa.T2, t2)
    for item in eval_set:
        prepared = kind.prepare(item, micro)
        assert prepared.state.harness.name == "livestream-micro"
        scores = qa.run_teacher(kind, item, micro)
        assert scores["accuracy"] == scores["effectiveness"] == 1.0, item.id


def test_t2_varies_the_micro_harness_with_held_out_names_only(micro, t2):
    train, heldout = hsa.default_bank(), qa.heldout_bank()
    train_names = {_name_key(n) for v in train.names.values() for n in v}
    train_names |= {_name_key(s.name) for s in train.synthetic}
    heldout_names = {n for v in heldout.names.values() for n in v}
    train_texts, heldout_texts = bank_texts(train), bank_texts(heldout)
    base_texts = surface_texts(hx.HarnessState(harness=hsa.link_mentions(micro.harness)))
    renamed = collections.Counter()
    for item in t2:
        state = qa.T2.prepare(item, micro).state
        assert state.harness.version == item.harness["version"] != micro.harness.version
        for kind, names in (("tool", state.harness.tool_names),
                            ("skill", state.harness.skill_names)):  # fmt: skip
            canonical = (
                state.renames.canonical_tool if kind == "tool" else state.renames.canonical_skill
            )
            for name in names:
                if name == canonical(name):
                    continue
                assert canonical(name) in (
                    micro.harness.tool_names if kind == "tool" else micro.harness.skill_names
                ), (item.id, name)  # a micro Skill or tool, renamed
                renamed[kind] += 1
                assert _name_key(name) not in train_names, (item.id, name)
                assert name in heldout_names or _OPAQUE[kind].match(name), (item.id, name)
        for text in surface_texts(state) - base_texts:
            assert text not in train_texts and text in heldout_texts, (item.id, text)
    assert renamed["tool"] >= len(t2) and renamed["skill"] >= len(t2)


def test_t3_sets_of_the_micro_room_use_its_tools_only(micro, pool):
    test_ids = {s.id for s in pool.split("test")}
    tool_set = hev.KINDS["t3_tool"].build(micro, split="test", size=SIZE, seed=0)
    prompt_set = hev.KINDS["t3_prompt"].build(micro, split="test", size=SIZE, seed=0)
    for eval_set in (tool_set, prompt_set):
        assert eval_set.room == "micro" and {i.id for i in eval_set} <= test_ids
    for item in tool_set:
        assert {d["mimics"] for d in item.harness["distractors"]} <= set(micro.harness.tool_names)
        hev.KINDS["t3_tool"].prepare(item, micro)  # the distractors fit the micro Harness


def test_a_sets_dir_of_one_room_is_refused_for_the_other(micro, v0, tmp_path):
    hev.ensure_set("t1", v0, sets_dir=tmp_path / "v0", size=SIZE)
    with pytest.raises(hev.SetVersionError, match=r"built for the 'v0' live room, not 'micro'"):
        hev.ensure_set("t1", micro, sets_dir=tmp_path / "v0", size=SIZE)
    # Even a set whose items do not depend on the room (the general prompts).
    general = hev.ensure_set("general", micro, sets_dir=tmp_path / "micro", size=4)
    assert general.room == "micro"
    with pytest.raises(hev.SetVersionError, match=r"built for the 'micro' live room, not 'v0'"):
        hev.ensure_set("general", v0, sets_dir=tmp_path / "micro", size=4)
    with pytest.raises(hev.SetVersionError, match=r"general-\w+ was built for the 'micro' live"):
        hev.evaluate([general], _teacher(), kinds=hev.KINDS, ctx=v0, run_dir=tmp_path / "run",
                     progress=False)  # fmt: skip


def test_a_manifest_without_a_room_reads_as_v0(v0, tmp_path):
    folder = write_set(tmp_path, qa.T1.build(v0, split="test", size=2, seed=0))
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["room"] == "v0"
    del manifest["room"]
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    back = read_set(folder)
    assert back.room == "v0" and back.version == manifest["version"]


# ------------------------------------------------------------------------------ launch.eval
def _teacher() -> hev.FactoryPolicy:
    return eval_launch.policy_for(eval_demo.get_config("teacher").policy)


def test_launch_eval_in_the_micro_room_records_it(tmp_path):
    c = eval_demo.get_config("teacher")
    c.room, c.sets = "micro", "t1,t2,t3_tool,t3_prompt"
    c.run_dir, c.sets_dir = str(tmp_path / "run"), str(tmp_path / "sets")
    c.sizes.update(dict(t1=SIZE, t2=SIZE, t3_tool=4, t3_prompt=4))
    summary = eval_launch.run(c)
    assert summary["run"]["room"] == "micro"
    assert summary["run"]["harness"] == hev.EvalContext.default("micro").harness.version
    for name in ("t1", "t2"):
        metrics = summary["sets"][name]["metrics"]
        assert metrics["accuracy"] == metrics["effectiveness"] == 1.0, name
    stored = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert stored["run"]["room"] == "micro"
    assert "- Live room: micro" in (tmp_path / "run" / "report.md").read_text()
    assert json.loads((tmp_path / "sets" / "t1" / MANIFEST_FILE).read_text())["room"] == "micro"
    assert "in the micro room" in eval_launch.summary_lines(summary)[0]
    c.room, c.run_dir = "v0", str(tmp_path / "v0-run")  # the micro sets are not v0's
    with pytest.raises(hev.SetVersionError, match=re.escape("'micro' live room, not 'v0'")):
        eval_launch.run(c)
    c.room = "v9"
    with pytest.raises(ValueError, match="unknown live room 'v9'"):
        eval_launch.build(c)


# ------------------------------------------------------------------------------ the held-out bank
def _paraphrasable(harness: hx.Harness) -> set[tuple[str, str]]:
    """(kind, text) of every non-empty text HSA may reword, as it looks them up in a bank."""
    h, norm = hsa.link_mentions(harness), lambda t: " ".join(str(t).split())
    out = {("prompt.item", norm(i)) for b in h.prompt.blocks for i in b.items}
    for s in h.skills:
        out |= {("skill.description", norm(s.description)), ("skill.intro", norm(s.intro))}
        out |= {("skill.rule", norm(r.text)) for r in s.rules}
    for t in h.tools:
        out.add(("tool.description", norm(t.description)))
        out |= {("tool.parameter", norm(p["description"]))
                for p in (t.parameters.get("properties") or {}).values() if p.get("description")}  # fmt: skip
    out |= {("hook.message", norm(r.message)) for r in h.hooks.hooks if r.message}
    return {(kind, text) for kind, text in out if text}


def test_every_micro_text_has_a_held_out_paraphrase_unlike_the_training_ones(micro):
    train, heldout = hsa.default_bank(), qa.heldout_bank()
    train_texts = bank_texts(train)
    texts = _paraphrasable(micro.harness)
    assert len(texts) >= 40 and not [t for t in texts if not heldout.paraphrases(*t)]
    for kind, text in texts:
        trained = {p.lower() for p in train.paraphrases(kind, text)}
        for p in heldout.paraphrases(kind, text):
            assert p.lower() not in trained | {text.lower()}, (kind, text, p)
            assert p.lower() not in train_texts, (kind, text, p)  # nor any training wording
