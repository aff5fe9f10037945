"""Online HSA: a stored trajectory re-rendered under a fresh augmentation changes its surface
names while its targets stay consistent, checked by replaying the re-rendered targets through
the real agent loop in the new Harness state."""

import dataclasses
import json

import numpy as np
import pytest

import data
from hat_jax import harness as hx
from hat_jax import hsa, livestream

SEEDS = range(6)


def _canonical_behaviour(conv, renames):
    """[(canonical tool, arguments with Skill names canonical)] and the reply texts."""
    calls, replies = [], []
    for m in conv.messages:
        for c in m.get("tool_calls") or ():
            tool = renames.canonical_tool(c["function"]["name"])
            args = dict(c["function"]["arguments"])
            if tool == "load_skill":
                args["name"] = renames.canonical_skill(args["name"])
            calls.append((tool, args))
            if "text" in args:
                replies.append(args["text"])
    return calls, replies


def _fresh(record, seed, dims=hsa.ALL, strength=0.5):
    conv = data.Conversation(id=record["id"], messages=record["messages"], tools=record["tools"])
    renames = record["trajectory"]["renames"]
    preserve = hsa.Preserve(skills=data.loaded_skills(conv, renames))
    base = hx.load(livestream.default_world_dir())
    new = hsa.augment(base, seed=seed, dims=dims, strength=strength, preserve=preserve)
    out = data.rerender(
        conv,
        request=record["trajectory"]["request"],
        renames=renames,
        new_state=new,
        constraints=record["state"]["constraints"],
    )
    return conv, data.pin_constraints(new, record["state"]["constraints"]), out


@pytest.mark.parametrize("seed", SEEDS)
def test_surface_names_change_and_the_behaviour_does_not(rule_records, seed):
    record = rule_records[seed % len(rule_records)]
    conv, new, out = _fresh(record, seed, strength=1.0)
    old = hx.RenameMap.from_dict(record["trajectory"]["renames"])
    assert _canonical_behaviour(out, new.renames) == _canonical_behaviour(conv, old)
    called = {c["function"]["name"] for m in out.messages for c in m.get("tool_calls") or ()}
    assert called <= set(new.harness.tool_names)
    assert called != {
        c["function"]["name"] for m in conv.messages for c in m.get("tool_calls") or ()
    }
    assert out.messages[0]["content"] != conv.messages[0]["content"]
    assert out.tools == [dict(t) for t in hx.tool_schemas(new)]
    for old_m, new_m in zip(conv.messages, out.messages, strict=True):
        assert old_m["role"] == new_m["role"]
        if new_m["role"] == "tool" and new.renames.canonical_tool(new_m["name"]) != "load_skill":
            assert new_m["content"] == old_m["content"]  # executors answer on canonical names


@pytest.mark.parametrize("seed", SEEDS)
def test_replaying_the_rerendered_targets_in_the_new_state_reproduces_them(
    rule_records, live_world, toolbox, seed
):
    """The strongest consistency check: a policy that says exactly the re-rendered assistant
    turns, run by the agent loop in the new state, sees exactly the re-rendered prompt and tool
    results and ends with the same reply."""
    record = rule_records[(seed + 3) % len(rule_records)]
    _, new, out = _fresh(record, seed)
    turns = [hx.turn_from_message(m) for m in out.messages if m["role"] == "assistant"]
    request = hx.Request.from_dict(record["trajectory"]["request"])
    traj = hx.run_agent(new, request, hx.ScriptedPolicy(turns), toolbox)
    original = [(f["kind"], f["detail"]) for f in record["trajectory"]["faults"]]
    assert [(f.kind, f.detail) for f in traj.faults] == original  # executors: canonical names
    assert not traj.final.fallback
    assert traj.final.public == record["trajectory"]["final"]["public"]
    assert traj.messages == out.messages
    assert [dict(t) for t in hx.tool_schemas(new)] == out.tools


def test_a_state_that_cannot_express_the_behaviour_is_refused(rule_records, base_state, tokenizer):
    record = next(
        r
        for r in rule_records
        if any(
            c["function"]["name"] == "check_inventory"
            for m in r["messages"]
            for c in m.get("tool_calls") or ()
        )
    )
    h = base_state.harness
    without = dataclasses.replace(h, tools=tuple(t for t in h.tools if t.name != "check_inventory"))
    conv = data.Conversation(id="x", messages=record["messages"], tools=record["tools"])
    with pytest.raises(data.RerenderError, match="check_inventory"):
        data.rerender(
            conv,
            request=record["trajectory"]["request"],
            renames={},
            new_state=hx.HarnessState(harness=without),
        )
    options = data.RenderOptions(seq_len=16384, hsa_probability=1.0)
    plain = data.prepare(json.dumps(record), record_id="x", tokenizer=tokenizer, options=options)
    refused = data.prepare(
        json.dumps(record),
        record_id="x",
        tokenizer=tokenizer,
        options=options,
        rng=np.random.default_rng(0),
        augmenter=lambda rng, skills: hx.HarnessState(harness=without),
    )
    assert refused.hsa == "refused" and refused.status == "ok"
    np.testing.assert_array_equal(refused.rows[0]["input_ids"], plain.rows[0]["input_ids"])


def test_records_of_another_base_harness_are_refused(rule_records, tokenizer):
    augmenter = data.make_augmenter(data.OnlineHSAConfig(probability=1.0))
    record = dict(rule_records[0])
    assert record["state"]["base_version"] == augmenter.base_version
    options = data.RenderOptions(seq_len=16384, hsa_probability=1.0)

    def prepare(r):
        rng = np.random.default_rng(1)
        return data.prepare(
            json.dumps(r), record_id="x", tokenizer=tokenizer, options=options, rng=rng,
            augmenter=augmenter,
        )  # fmt: skip

    assert prepare(record).hsa == "applied"
    record["state"] = {**record["state"], "base_version": "0123456789abcdef"}
    assert prepare(record).hsa == "refused"


def test_numeric_constraints_are_pinned_to_the_trajectorys(rule_records, base_state):
    record = rule_records[0]
    prompt = base_state.harness.prompt
    value = prompt.constraint("reply_max_chars")
    moved = dataclasses.replace(
        base_state,
        harness=dataclasses.replace(
            base_state.harness, prompt=prompt.with_constraint("reply_max_chars", value - 40)
        ),
    )
    conv = data.Conversation(id="x", messages=record["messages"], tools=record["tools"])
    kw = dict(request=record["trajectory"]["request"], renames={}, new_state=moved)
    pinned = data.rerender(conv, constraints=record["state"]["constraints"], **kw)
    unpinned = data.rerender(conv, **kw)
    assert pinned.messages == conv.messages
    assert unpinned.messages[0] != conv.messages[0]


def test_pipeline_online_hsa_is_seeded_and_counted(corpus_file, tokenizer):
    def make(probability, seed=0):
        config = data.PipelineConfig(
            sources=(str(corpus_file),),
            seq_len=16384,
            global_batch_size=1,
            seed=seed,
            online_hsa=data.OnlineHSAConfig(probability=probability),
        )
        return data.sft_data(config, tokenizer=tokenizer, process_index=0, process_count=1)

    plain, a, b = make(0.0), make(1.0), make(1.0)
    xs, ys, zs = ([next(it)["input_ids"] for _ in range(3)] for it in (plain, a, b))
    assert all(np.array_equal(y, z) for y, z in zip(ys, zs, strict=True))
    assert not any(np.array_equal(x, y) for x, y in zip(xs, ys, strict=True))
    stats = a.stats()
    assert stats["hsa_applied"] == stats["records"] > 0 and stats["hsa_refused"] == 0
    assert plain.stats()["hsa_applied"] == 0
