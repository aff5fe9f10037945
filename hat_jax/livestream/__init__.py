"""The live-commerce domain the Harness runtime (`hat_jax.harness`) runs: the world (catalog,
live room, orders, viewers, marketing), its built-in retrieval and commerce tools, the marketing
service and its MCP server, the offline rule-based policy, and the libraries Harness v0 names:
the commerce checks (hooks.yaml: `hat_jax.livestream.checks`) and the `product` and `room`
prompt blocks (prompt.yaml: `hat_jax.livestream.prompt`; the micro room's compact `product_brief`
and `room_brief`), and the bundled rooms (`room("v0")`, `room("micro")`: which Harness and
which comment phrasings run on the world).

    from hat_jax import harness as hx, livestream
    world = livestream.load_world(livestream.default_world_dir())
    tools = livestream.builtin_toolbox(world)
    with hx.McpToolset(livestream.marketing_server(world)) as mcp:
        ...
"""

import pathlib

from hat_jax.livestream._factcheck import Evidence, unsupported_claims
from hat_jax.livestream._marketing import (
    MarketingService,
    marketing_server,
    marketing_server_params,
)
from hat_jax.livestream._rooms import ROOMS, Room, room
from hat_jax.livestream._rule_policy import RuleBasedPolicy
from hat_jax.livestream._tools import builtin_toolbox
from hat_jax.livestream._wording import coupon_granted, order_details
from hat_jax.livestream._world import World, WorldError, load_world
from hat_jax.livestream.prompt import clock, money


def default_world_dir() -> pathlib.Path:
    """The bundled world (`data/livestream/`, with Harness v0 in its `harness/` folder)."""
    return pathlib.Path(__file__).resolve().parents[2] / "data" / "livestream"


__all__ = [
    "ROOMS",
    "Evidence",
    "MarketingService",
    "Room",
    "RuleBasedPolicy",
    "World",
    "WorldError",
    "builtin_toolbox",
    "clock",
    "coupon_granted",
    "default_world_dir",
    "load_world",
    "marketing_server",
    "marketing_server_params",
    "money",
    "order_details",
    "room",
    "unsupported_claims",
]
