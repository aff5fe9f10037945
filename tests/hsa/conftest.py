"""Fixtures for the Harness-State Augmentation tests: Harness v0 and the bundled world."""

import pytest

from hat_jax import harness as hx


@pytest.fixture(scope="session")
def base() -> hx.Harness:
    return hx.load(hx.default_world_dir())


@pytest.fixture(scope="session")
def world() -> hx.World:
    return hx.load_world(hx.default_world_dir())
