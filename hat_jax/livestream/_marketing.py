"""The bundled marketing service: coupons, lotteries and follower gifts over MCP.

An `MCPServer` (mcp 2.x) whose tools are discovered by the Harness at start-up, as the paper's
marketing interfaces are. It answers from the world files and keeps its own ledger (coupons
issued per viewer, campaign stock, gifts claimed) for the lifetime of the process. The policy
never chooses coupon amounts: the server picks the best campaign the viewer is eligible for.

Run it standalone (stdio by default, or streamable HTTP):

    python -m hat_jax.livestream.serve_marketing --world data/livestream
    python -m hat_jax.livestream.serve_marketing --world data/livestream --transport streamable-http --port 8765
"""

from __future__ import annotations

import collections
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from hat_jax.harness import ToolError as HarnessToolError
from hat_jax.livestream._world import World, load_world

if TYPE_CHECKING:
    from mcp import StdioServerParameters
    from mcp.server.mcpserver import MCPServer

# `mcp` is imported by the functions that build a server (about a second to import): the
# simulator's sandbox calls `MarketingService` in-process and needs none of it.

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


class MarketingService:
    """The campaign logic of the marketing service over one ledger (coupons issued per viewer,
    campaign stock, gifts claimed).

    The MCP server keeps one for the lifetime of its process; the simulator's sandbox makes a
    fresh one per episode so every episode starts from the same state. Failures raise the
    Harness's `ToolError`, whose message goes back to the policy.
    """

    def __init__(self, world: World):
        self.world = world
        self.remaining = {
            c["campaign_id"]: c["remaining"] for c in world.marketing["coupon_campaigns"]
        }
        self.issued: collections.Counter = collections.Counter()
        self.gifts_left = world.marketing["follow_gift"]["remaining"]
        self.gift_claimed: set[str] = set()

    def executors(self) -> dict[str, Callable[[Mapping[str, Any]], Any]]:
        """Canonical tool name -> executor taking the call's arguments."""
        return {
            "issue_coupon": lambda a: self.issue_coupon(a["viewer_id"], a.get("product_id")),
            "get_lottery_status": lambda a: self.lottery_status(a.get("lottery_id")),
            "claim_follow_gift": lambda a: self.claim_follow_gift(a["viewer_id"]),
        }

    def _viewer(self, viewer_id: str) -> Mapping[str, Any]:
        viewer = self.world.viewers.get(viewer_id)
        if viewer is None:
            raise HarnessToolError(
                "this viewer is not logged in, so no coupon or gift can be issued"
            )
        return viewer

    def issue_coupon(self, viewer_id: str, product_id: str | None = None) -> dict[str, Any]:
        """Issues the best campaign coupon the viewer is eligible for (the caller never picks
        the amount): usable on the product alone first, then the largest discount."""
        world, viewer = self.world, self._viewer(viewer_id)
        product = world.products.get(product_id) if product_id else None
        if product_id and product is None:
            raise HarnessToolError(f"no product with id {product_id!r}")
        price = world.price_info(product_id)["current_price"] if product else None
        reasons, eligible = [], []
        for c in world.marketing["coupon_campaigns"]:
            scope = c["scope"]
            if c["campaign_id"] not in world.room["active_campaigns"] or not world.campaign_active(
                c
            ):
                continue
            if scope["type"] == "category" and (
                product is None or product["category"] != scope["category"]
            ):
                continue
            if c["followers_only"] and not viewer["follower"]:
                reasons.append(f"{c['title']} is for followers only")
            elif self.remaining[c["campaign_id"]] <= 0:
                reasons.append(f"{c['title']} is fully claimed")
            elif self.issued[(viewer_id, c["campaign_id"])] >= c["per_viewer_limit"]:
                reasons.append(f"you already have the {c['title']} coupon")
            else:
                usable_alone = price is not None and price >= c["min_spend"]
                eligible.append((not usable_alone, -c["discount"], c["campaign_id"], c))
        if not eligible:
            raise HarnessToolError(
                "no coupon available: " + ("; ".join(reasons) or "no active campaign applies")
            )
        c = min(eligible, key=lambda e: e[:3])[3]
        self.remaining[c["campaign_id"]] -= 1
        self.issued[(viewer_id, c["campaign_id"])] += 1
        scope = (
            "all products" if c["scope"]["type"] == "all" else f"{c['scope']['category']} products"
        )
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

    def lottery_status(self, lottery_id: str | None = None) -> dict[str, Any]:
        """The room's lottery (or `lottery_id`): prize, draw time, entry, winners once drawn."""
        return self.world.lottery(lottery_id)

    def claim_follow_gift(self, viewer_id: str) -> dict[str, Any]:
        """Grants the follower gift once per following viewer while gifts last."""
        viewer, gift = self._viewer(viewer_id), self.world.marketing["follow_gift"]
        if not viewer["follower"]:
            raise HarnessToolError(
                "the follower gift is for followers of the live room; the viewer does not follow yet"
            )
        if viewer_id in self.gift_claimed:
            raise HarnessToolError("the follower gift was already claimed by this viewer")
        if self.gifts_left <= 0:
            raise HarnessToolError("all follower gifts have been claimed")
        self.gifts_left -= 1
        self.gift_claimed.add(viewer_id)
        return {"granted": True, "gift": gift["gift"], "delivery": gift["delivery"]}


def _served(fn: Callable[..., dict[str, Any]], *args) -> dict[str, Any]:
    """Runs a service call, turning the Harness's tool errors into MCP tool errors."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return fn(*args)
    except HarnessToolError as err:
        raise ToolError(str(err)) from err


def marketing_server(world: World | str | pathlib.Path) -> MCPServer:
    """Builds the marketing MCP server over `world` (a `World` or a world folder)."""
    from mcp.server.mcpserver import MCPServer

    world = world if isinstance(world, World) else load_world(world)
    service = MarketingService(world)
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
        return _served(service.issue_coupon, viewer_id, product_id)

    @server.tool(structured_output=True)
    def get_lottery_status(lottery_id: _LOTTERY = None) -> dict[str, Any]:
        """Get the live-room lottery: prize, draw time, how to enter, and winners once drawn."""
        return _served(service.lottery_status, lottery_id)

    @server.tool(structured_output=True)
    def claim_follow_gift(viewer_id: _VIEWER) -> dict[str, Any]:
        """Claim the follower gift for a viewer who follows the live room (once per viewer)."""
        return _served(service.claim_follow_gift, viewer_id)

    return server


def marketing_server_params(world_dir: str | pathlib.Path) -> StdioServerParameters:
    """How to launch the bundled server as a stdio subprocess (for `mcp.Client`)."""
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "hat_jax.livestream.serve_marketing",
            "--world",
            str(pathlib.Path(world_dir).resolve()),
        ],
        cwd=str(pathlib.Path(__file__).resolve().parents[2]),
    )
