"""Fixtures for the Harness runtime tests: the bundled world, Harness v0, tools and helpers."""

import pathlib
import shutil

import pytest

from hat_jax import harness as hx
from hat_jax import livestream
from tests.harness._helpers import Spy


@pytest.fixture(scope="session")
def world_dir() -> pathlib.Path:
    return livestream.default_world_dir()


@pytest.fixture(scope="session")
def harness(world_dir) -> hx.Harness:
    return hx.load(world_dir)


@pytest.fixture(scope="session")
def world(world_dir) -> livestream.World:
    return livestream.load_world(world_dir)


@pytest.fixture
def state(harness) -> hx.HarnessState:
    return hx.HarnessState(harness=harness)


@pytest.fixture
def tools(world) -> hx.Toolbox:
    return livestream.builtin_toolbox(world)


@pytest.fixture
def harness_copy(world_dir, tmp_path) -> pathlib.Path:
    """A writable copy of Harness v0 for edits that must fail (or pass) validation."""
    dest = tmp_path / "harness"
    shutil.copytree(world_dir / "harness", dest)
    return dest


@pytest.fixture
def request_for(world):
    """`request_for(text, viewer="v1001", **kw)`: a request from the bundled world."""

    def make(text: str, viewer: str = "v1001", **kwargs) -> hx.Request:
        handle = world.viewers[viewer]["handle"] if viewer in world.viewers else viewer
        return world.make_request(hx.Comment(text=text, viewer_id=viewer, handle=handle), **kwargs)

    return make


@pytest.fixture
def spy(tools):
    return Spy(tools)


@pytest.fixture
def marketing(tools):
    """Built-in tools plus recording stand-ins for the MCP marketing executors."""
    fake = {
        "issue_coupon": lambda a: {"issued": True, "discount": 10.0, "min_spend": 0.0},
        "get_lottery_status": lambda a: {"status": "open"},
        "claim_follow_gift": lambda a: {"granted": True, "gift": "serum", "delivery": "soon"},
    }
    return Spy(tools.merged(fake))
