"""The bundled marketing service: coupons, lotteries and follower gifts over MCP.

An `MCPServer` (mcp 2.x) whose tools are discovered by the Harness at start-up, as the paper's
marketing interfaces are. It answers from the world files and keeps its own ledger (coupons
issued per viewer, campaign stock, gifts claimed) for the lifetime of the process. The policy
never chooses coupon amounts: the server picks the best campaign the viewer is eligible for.

Run it standalone (stdio by default, or streamable HTTP):

    python -m hat_jax.harness.serve_marketing --world data/livestream
    python -m hat_jax.harness.serve_marketing --world data/livestream --transport streamable-http --port 8765
"""

from __future__ import annotations

import collections
import pathlib
import sys
from typing import Annotated, Any

from mcp import StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from hat_jax.harness._world import World, load_world

_VIEWER = Annotated[
    str,
    Field(
        description="The viewer the action is for (set by the runtime).",
        min_length=1,
        max_length=64,
    ),
]
_PRODUCT = Annotated[
    str | None,
    Field(description="Catalog product id, for example BT-001.", pattern=r"^[A-Z]{2}-[0-9]{3}$"),
]
_LOTTERY = Annotated[
    str | None,
    Field(
        description="Lottery id; the room's current lottery when omitted.",
        pattern=r"^LT-[0-9]{4}-[0-9]{4}$",
    ),
]


class _Ledger:
    """Mutable marketing state of one server process."""

    def __init__(self, world: World):
        self.remaining = {
            c["campaign_id"]: c["remaining"] for c in world.marketing["coupon_campaigns"]
        }
        self.issued: collections.Counter = collections.Counter()
        self.gifts_left = world.marketing["follow_gift"]["remaining"]
        self.gift_claimed: set[str] = set()


def _viewer(world: World, viewer_id: str):
    viewer = world.viewers.get(viewer_id)
    if viewer is None:
        raise ToolError("this viewer is not logged in, so no coupon or gift can be issued")
    return viewer


def _issue_coupon(
    world: World, ledger: _Ledger, viewer_id: str, product_id: str | None
) -> dict[str, Any]:
    viewer = _viewer(world, viewer_id)
    product = world.products.get(product_id) if product_id else None
    if product_id and product is None:
        raise ToolError(f"no product with id {product_id!r}")
    price = world.price_info(product_id)["current_price"] if product else None
    reasons, eligible = [], []
    for c in world.marketing["coupon_campaigns"]:
        scope = c["scope"]
        if c["campaign_id"] not in world.room["active_campaigns"] or not world.campaign_active(c):
            continue
        if scope["type"] == "category" and (
            product is None or product["category"] != scope["category"]
        ):
            continue
        if c["followers_only"] and not viewer["follower"]:
            reasons.append(f"{c['title']} is for followers only")
        elif ledger.remaining[c["campaign_id"]] <= 0:
            reasons.append(f"{c['title']} is fully claimed")
        elif ledger.issued[(viewer_id, c["campaign_id"])] >= c["per_viewer_limit"]:
            reasons.append(f"you already have the {c['title']} coupon")
        else:
            usable_alone = price is not None and price >= c["min_spend"]
            eligible.append((not usable_alone, -c["discount"], c["campaign_id"], c))
    if not eligible:
        raise ToolError(
            "no coupon available: " + ("; ".join(reasons) or "no active campaign applies")
        )
    c = min(eligible, key=lambda e: e[:3])[3]
    ledger.remaining[c["campaign_id"]] -= 1
    ledger.issued[(viewer_id, c["campaign_id"])] += 1
    scope = "all products" if c["scope"]["type"] == "all" else f"{c['scope']['category']} products"
    return {
        "issued": True,
        "coupon_code": f"{c['campaign_id']}-{viewer_id.upper()}",
        "campaign_id": c["campaign_id"],
        "title": c["title"],
        "discount": c["discount"],
        "min_spend": c["min_spend"],
        "applies_to": scope,
        "valid_until": c["end"],
    }


def _claim_gift(world: World, ledger: _Ledger, viewer_id: str) -> dict[str, Any]:
    viewer = _viewer(world, viewer_id)
    gift = world.marketing["follow_gift"]
    if not viewer["follower"]:
        raise ToolError(
            "the follower gift is for followers of the live room; the viewer does not follow yet"
        )
    if viewer_id in ledger.gift_claimed:
        raise ToolError("the follower gift was already claimed by this viewer")
    if ledger.gifts_left <= 0:
        raise ToolError("all follower gifts have been claimed")
    ledger.gifts_left -= 1
    ledger.gift_claimed.add(viewer_id)
    return {"granted": True, "gift": gift["gift"], "delivery": gift["delivery"]}


def marketing_server(world: World | str | pathlib.Path) -> MCPServer:
    """Builds the marketing MCP server over `world` (a `World` or a world folder)."""
    world = world if isinstance(world, World) else load_world(world)
    ledger = _Ledger(world)
    server = MCPServer(
        "livestream-marketing",
        version="1.0.0",
        log_level="WARNING",
        instructions="Marketing actions of the live room: coupons, lotteries and follower gifts.",
    )

    @server.tool(structured_output=True)
    def issue_coupon(viewer_id: _VIEWER, product_id: _PRODUCT = None) -> dict[str, Any]:
        """Issue the best live-room coupon the viewer is eligible for, optionally for a product.
        The coupon value is set by the active campaigns, not by the caller."""
        return _issue_coupon(world, ledger, viewer_id, product_id)

    @server.tool(structured_output=True)
    def get_lottery_status(lottery_id: _LOTTERY = None) -> dict[str, Any]:
        """Get the live-room lottery: prize, draw time, how to enter, and winners once drawn."""
        try:
            return world.lottery(lottery_id)
        except Exception as err:
            raise ToolError(str(err)) from err

    @server.tool(structured_output=True)
    def claim_follow_gift(viewer_id: _VIEWER) -> dict[str, Any]:
        """Claim the follower gift for a viewer who follows the live room (once per viewer)."""
        return _claim_gift(world, ledger, viewer_id)

    return server


def marketing_server_params(world_dir: str | pathlib.Path) -> StdioServerParameters:
    """How to launch the bundled server as a stdio subprocess (for `mcp.Client`)."""
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "hat_jax.harness.serve_marketing",
            "--world",
            str(pathlib.Path(world_dir).resolve()),
        ],
        cwd=str(pathlib.Path(__file__).resolve().parents[2]),
    )
