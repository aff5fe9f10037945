"""The micro live room: its compact Harness validates and reconciles like Harness v0, its
phrasing splits hold out sentences but no words, every family is covered in every split and
solved by the teacher, and its conversations fit the room's token budget under every HSA
dimension."""

import collections
import functools
import json

import numpy as np
import pytest

import data
from data.tokenizer import load_tokenizer
from hat_jax import harness as hx
from hat_jax import hsa, livestream
from rl import sim


@functools.cache
def _micro() -> hx.Harness:
    return hx.load(livestream.room("micro").harness_dir)


def test_rooms_name_their_files_and_unknown_rooms_are_refused():
    micro, v0 = livestream.room("micro"), livestream.room("v0")
    assert micro.world_dir == v0.world_dir == livestream.default_world_dir()
    assert micro.harness_dir.name == "harness_micro" and v0.harness_dir.name == "harness"
    assert micro.token_budget < v0.token_budget
    with pytest.raises(ValueError, match=r"unknown live room 'v9'.*'v0', 'micro'"):
        livestream.room("v9")
    with pytest.raises(ValueError, match="unknown live room"):
        sim.SimConfig(room="v9")
    with pytest.raises(ValueError, match="unknown live room"):
        data.CorpusConfig(room="v9")


def test_the_micro_harness_is_a_compact_release_of_the_same_runtime():
    """It loads, validates and reconciles against its own manifest (editing it without
    bumping versions and the manifest fails here on purpose), keeps v0's Hooks, and has
    fewer Skills and tools, each one of v0's."""
    micro, v0 = _micro(), hx.load(livestream.room("v0").harness_dir)
    manifest = livestream.room("micro").harness_dir / "manifest.json"
    assert hx.reconcile(micro, manifest) == []
    assert json.loads(manifest.read_text())["version"] == micro.version != v0.version
    assert micro.name == "livestream-micro" and micro.release == "micro-v0"
    assert micro.hooks == v0.hooks
    skills, tools = {s.name for s in micro.skills}, {t.name for t in micro.tools}
    assert skills < {s.name for s in v0.skills} and tools < {t.name for t in v0.tools}
    assert len(skills) == 5 and len(tools) == 11


def test_phrasings_hold_out_sentences_not_words():
    """Every word of a held-out phrasing occurs in training phrasings; no held-out phrasing
    is a training phrasing; each split has phrasings of every family."""
    phrasings = sim.load_phrasings(livestream.room("micro").phrasings)
    assert sim.vocabulary_gaps(phrasings) == {}
    for family, templates in phrasings["families"].items():
        splits = collections.Counter(t["split"] for t in templates)
        assert set(splits) == {"train", "dev", "test"}, (family, splits)
        texts = {s: {tuple(t.get("comments") or [t["text"]]) for t in templates
                     if t["split"] == s} for s in splits}  # fmt: skip
        assert not texts["train"] & (texts["dev"] | texts["test"]), family


def test_vocabulary_gaps_finds_new_words_and_repeated_sentences():
    """The check itself: a held-out phrasing with an unseen word, and one equal to a
    training phrasing, are both reported."""
    families = {"casual_chat": [
        {"id": "a", "split": "train", "text": "hi there Mia"},
        {"id": "b", "split": "dev", "text": "hi there bob"},
        {"id": "c", "split": "test", "text": "hi there Mia"},
        {"id": "d", "split": "test", "text": "Mia there hi"},
    ]}  # fmt: skip
    assert sim.vocabulary_gaps({"families": families}) == {
        "b": ["bob"],
        "c": ["<same as training>"],
    }


def test_every_family_in_every_split_with_held_out_products():
    pool = sim.default_scenarios("micro")
    for split in sim.SPLITS:
        assert {s.family for s in pool.split(split)} == set(sim.FAMILIES), split
    splits = sim.product_splits(livestream.load_world(livestream.default_world_dir()))
    for s in pool.split("train"):
        for intent in s.gold.intents:
            if intent.product_id:
                assert splits[intent.product_id] == "train", s.id
    phrasing = {split: {s.phrasing for s in pool.split(split)} for split in sim.SPLITS}
    assert not phrasing["train"] & (phrasing["dev"] | phrasing["test"])


def _longest(pool, family: str, n: int) -> list:
    """The n scenarios of a family with the longest comments (the longest conversations)."""
    members = [s for s in pool if s.family == family]
    return sorted(members, key=lambda s: (-sum(len(c.text) for c in s.comments), s.id))[:n]


@pytest.mark.slow
def test_conversations_fit_the_token_budget_under_every_dimension():
    """The teacher's conversation of each family's longest comments, under the released
    Harness and under HSA of each dimension alone and all together at full strength, renders
    within the room's token budget with the demo tokenizer; the teacher solves every one."""
    spec = livestream.room("micro")
    room = sim.LiveRoom(sim.SimConfig(room="micro", split="test"))
    tokenizer, lengths = load_tokenizer(), collections.defaultdict(list)
    options = data.RenderOptions(seq_len=10 * spec.token_budget)
    dimsets = [(), *[(d,) for d in sorted(hsa.ALL)], tuple(sorted(hsa.ALL))]
    for family in sim.FAMILIES:
        for k, scenario in enumerate(_longest(room.scenarios, family, 2)):
            for dims in dimsets:
                state = (hsa.augment(room.harness, seed=k, dims=dims, strength=1.0,
                                     preserve=sim.injection_needs(scenario, None))
                         if dims else hx.HarnessState(harness=room.harness))  # fmt: skip
                ep = room.run(room.teacher(), scenario, seed=k, state=state,
                              faults=sim.FaultConfig())  # fmt: skip
                assert ep.rewards.accuracy == ep.rewards.effectiveness == 1.0, (scenario.id, dims)
                record = data.corpus_record(
                    ep.trajectory, record_id=scenario.id,
                    tools=[dict(t) for t in hx.tool_schemas(state)],
                    state=data.state_info(state),
                )  # fmt: skip
                prepared = data.prepare(record, record_id=scenario.id, tokenizer=tokenizer,
                                        options=options)  # fmt: skip
                assert prepared.status == "ok", prepared.reason
                lengths[dims or ("original",)] += [len(r["input_ids"]) for r in prepared.rows]
    everything = np.concatenate([np.asarray(v) for v in lengths.values()])
    worst = max(lengths, key=lambda d: max(lengths[d]))
    assert everything.max() <= spec.token_budget, (worst, max(lengths[worst]))
    assert np.median(everything) < 0.8 * spec.token_budget
