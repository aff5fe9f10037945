"""The live room's built-in retrieval and commerce tools, answering from a `World`."""

from __future__ import annotations

from hat_jax.harness import Toolbox
from hat_jax.livestream._world import World


def builtin_toolbox(world: World) -> Toolbox:
    """Executors of the built-in retrieval and commerce tools, answering from `world`.

    They are in-memory lookups, so they are declared inline (no worker-thread hand-off).
    """
    executors = {
        "search_products": lambda a: world.search_products(
            a["query"], a.get("category"), a.get("limit", 5)
        ),
        "get_product_detail": lambda a: world.product_detail(a["product_id"]),
        "search_faq": lambda a: world.search_faq(
            a["query"], a.get("product_id"), a.get("limit", 3)
        ),
        "check_inventory": lambda a: world.inventory(a["product_id"], a.get("variant")),
        "get_price_promotion": lambda a: world.price_info(a["product_id"], a.get("now")),
        "get_order_status": lambda a: world.order_status(a["order_id"], a["viewer_id"]),
        "get_after_sales_policy": lambda a: world.after_sales_policy(
            a.get("product_id"), a.get("topic")
        ),
    }
    return Toolbox(executors, inline=executors)
