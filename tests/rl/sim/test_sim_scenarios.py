"""Scenario generation: size, families, splits that hold out products and phrasings, gold that
the teacher's own reply satisfies, determinism, JSONL round trip, template validation."""

import collections
import re

import pytest
import yaml

from hat_jax import harness as hx
from rl import sim
from rl.rewards import states


def test_at_least_2000_distinct_scenarios_over_every_family(scenarios):
    keys = {(tuple((c.text, c.viewer_id) for c in s.comments), s.product_id) for s in scenarios}
    assert len(keys) >= 2000
    counts = scenarios.counts()
    assert set(counts["train"]) == set(sim.FAMILIES)
    for split in ("dev", "test"):
        assert len(counts[split]) >= 11, counts[split]


def test_splits_hold_out_products_and_phrasings(scenarios, world):
    splits = sim.product_splits(world)
    by_split = collections.defaultdict(lambda: (set(), set()))
    for s in scenarios:
        products, phrasings = by_split[s.split]
        phrasings.add(s.phrasing)
        for i in s.gold.intents:
            pid = i.product_id or (
                world.orders[i.detail["order_id"]]["product_id"] if "order_id" in i.detail else None
            )
            if pid:
                assert splits[pid] == s.split, s.id
                products.add(pid)
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not by_split[a][0] & by_split[b][0]
        assert not by_split[a][1] & by_split[b][1]
    categories = {world.products[p]["category"] for p in by_split["test"][0]}
    assert len(categories) == 6  # every category has a held-out product


def test_gold_reply_of_every_scenario_states_its_facts(scenarios, world, base):
    """The teacher's reply under Harness v0, from fault-free tool results, satisfies the gold."""
    for s in scenarios:
        sandbox, results = sim.Sandbox(world), sim.Results()
        context = {
            "viewer_id": s.comments[0].viewer_id,
            "room_id": world.room["room_id"],
            "now": world.room["now"],
        }
        for pattern, args in sim.plan_calls(s):
            injected = {k: context[k] for k in base.tool(pattern.tool).context_args}
            try:
                value = sandbox.tools[pattern.tool]({**args, **injected})
            except hx.ToolError as err:
                value = {"error": {"type": err.kind, "message": str(err)}}
            results.add(pattern.tool, args, value)
        clauses = [sim.clause(i, results, world) for i in s.gold.intents]
        public, private = sim.compose(
            clauses, [c.handle for c in s.comments], max_chars=200, max_sentences=3
        )
        assert len(public) <= 200 and len(private or "") <= 200
        for f in s.gold.facts:
            text = {"public": public, "private": private or ""}.get(
                f.channel, f"{public} {private}"
            )
            assert states(text, f.kind, f.value, f.ratio), (s.id, f, public, private)
        for c in s.gold.claims:
            assert not re.search(c.pattern, public, re.I), (s.id, c)


def test_needs_are_what_the_gold_requires(scenarios):
    for s in scenarios:
        assert s.needs.min_rounds == 2 + any(c.after for c in s.gold.calls)
        chosen = s.needs.skills
        assert all(group & chosen for group in s.gold.skills), s.id
        assert chosen <= s.gold.skill_names
        assert 0 < s.needs.min_reply_chars <= 200


def test_jsonl_round_trip(scenarios, tmp_path):
    subset = scenarios[::97]
    path = sim.write_scenarios(tmp_path / "s.jsonl", subset)
    back = sim.read_scenarios(path)
    assert [s.to_dict() for s in back] == [s.to_dict() for s in subset]
    path.write_text(path.read_text() + '{"id": "broken"}\n')
    with pytest.raises(ValueError, match=r"s.jsonl:\d+: not a scenario"):
        sim.read_scenarios(path)


@pytest.fixture
def small_phrasings(world, tmp_path):
    data = yaml.safe_load(sim.phrasings_path(world).read_text())
    data["families"] = {f: templates[:2] for f, templates in data["families"].items()}
    path = tmp_path / "phrasings.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path, data


def test_generation_is_deterministic(world, small_phrasings):
    path, _ = small_phrasings
    a = sim.generate_scenarios(world, phrasings=path)
    b = sim.generate_scenarios(world, phrasings=path)
    assert len(a) > 100 and [s.to_dict() for s in a] == [s.to_dict() for s in b]


def test_bad_templates_are_named(world, small_phrasings, tmp_path):
    path, data = small_phrasings
    data["families"]["stock"][0]["split"] = "holdout"
    data["families"]["shipping"][0]["intents"] = ["teleport"]
    del data["families"]["feedback"]
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    with pytest.raises(ValueError) as err:
        sim.generate_scenarios(world, phrasings=path)
    text = str(err.value)
    assert "stock/stock-01: split must be one of" in text
    assert "shipping/ship-01: unknown or missing intents ['teleport']" in text
    assert "no templates for families ['feedback']" in text


def test_scenario_set_views(scenarios):
    assert len(scenarios.split("test")) + len(scenarios.split("dev")) + len(
        scenarios.split("train")
    ) == len(scenarios)
    some = scenarios[5]
    assert scenarios.get(some.id) is some
    with pytest.raises(KeyError, match="no scenario"):
        scenarios.get("nope")
    with pytest.raises(ValueError, match="unknown family"):
        scenarios.family("weather")
