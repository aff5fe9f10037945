"""Fixtures for the Harness-State Augmentation tests: Harness v0, the micro room's compact
Harness and the bundled world."""

import pytest

from hat_jax import harness as hx
from hat_jax import livestream


@pytest.fixture(scope="session")
def base() -> hx.Harness:
    return hx.load(livestream.default_world_dir())


@pytest.fixture(scope="session")
def micro() -> hx.Harness:
    return hx.load(livestream.room("micro").harness_dir)


@pytest.fixture(scope="session")
def world() -> livestream.World:
    return livestream.load_world(livestream.default_world_dir())
