"""Fixtures for the live-room simulator tests: the bundled world, Harness v0, the scenarios."""

import pytest

from hat_jax import harness as hx
from hat_jax import livestream
from rl import sim
from rl.rewards import Rewarder


@pytest.fixture(scope="session")
def world() -> livestream.World:
    return livestream.load_world(livestream.default_world_dir())


@pytest.fixture(scope="session")
def base() -> hx.Harness:
    return hx.load(livestream.default_world_dir())


@pytest.fixture(scope="session")
def scenarios() -> sim.ScenarioSet:
    return sim.default_scenarios()


@pytest.fixture(scope="session")
def rewarder(base) -> Rewarder:
    return Rewarder(base)


@pytest.fixture(scope="session")
def room(world, base, scenarios) -> sim.LiveRoom:
    return sim.LiveRoom(world=world, harness=base, scenarios=scenarios)


@pytest.fixture(scope="session")
def pick(scenarios):
    """`pick(family=..., phrasing=..., **where)`: the first scenario matching, by id order."""

    def find(**where):
        for s in scenarios:
            if all(
                getattr(s, k, None) == v
                or (k == "kind" and any(i.kind == v for i in s.gold.intents))
                or (k == "contains" and v in s.id)
                for k, v in where.items()
            ):
                return s
        raise LookupError(f"no scenario with {where}")

    return find
