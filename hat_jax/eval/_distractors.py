"""Distractor tools of T3 Tool Robustness: look-alikes of the tools an item needs.

A distractor is a real `ToolSpec` added to the item's Harness right after the tool it mimics:
its name and description overlap the expected tool's ("a legacy price lookup", "an archived
inventory snapshot", "a warehouse stock estimate"), it takes the same arguments, belongs to the
same category and is allowed by every Skill that allows the mimicked tool, so nothing but its
wording tells it apart. Its sandbox executor answers plausibly but without what the item needs:

- `stale`: dated data (last season's list price, a year-old stock snapshot, finished lotteries);
- `partial`: related data that leaves the question open (name and brand without specs,
  variants without counts, campaign titles without amounts);
- `unavailable`: a polite "not available for live rooms" answer.

`check_no_leak` runs every chosen distractor at build time and rejects one whose answer states
a figure or text the item's reply must state, so a policy can only score by calling the right
tool.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hat_jax import harness as hx
from hat_jax import livestream
from rl.rewards import _facts
from rl.sim import Fact

ANSWERS = ("stale", "partial", "unavailable")


@dataclasses.dataclass(frozen=True)
class Look:
    """One entry of the distractor bank: a look-alike of canonical tool `mimics`."""

    name: str
    mimics: str
    answer: str
    description: str


BANK: tuple[Look, ...] = (
    Look("legacy_price_lookup", "get_price_promotion", "stale",
         "Look up a product's price in the legacy price list: the list price and the last "
         "recorded discount. Use it for price questions about catalog products."),
    Look("get_price_history", "get_price_promotion", "stale",
         "Get the price history of a product: past list prices and promotion prices by date."),
    Look("price_estimate", "get_price_promotion", "unavailable",
         "Estimate the selling price of a product, including typical discounts, from recent "
         "sales. Returns a price range."),
    Look("archived_inventory_snapshot", "check_inventory", "stale",
         "Check stock for a product per variant from the inventory snapshot. Returns the "
         "number of units per size, shade, colour or capacity."),
    Look("warehouse_stock_estimate", "check_inventory", "unavailable",
         "Estimate how many units of a product the warehouse holds, per variant. Use it when "
         "viewers ask whether something is in stock."),
    Look("check_restock_schedule", "check_inventory", "partial",
         "Check the restock schedule of a product's variants: which variants are due for "
         "restock and when."),
    Look("product_catalog_summary", "get_product_detail", "partial",
         "Get a short catalog summary of one product: name, brand, category and variants. "
         "Use it for questions about a product."),
    Look("legacy_spec_sheet", "get_product_detail", "unavailable",
         "Get the specification sheet of a product (size, material, ingredients, shipping) "
         "from the legacy product database."),
    Look("search_catalog_archive", "search_products", "partial",
         "Search the product catalog archive by keywords (product name, type, brand or "
         "category). Returns matching products."),
    Look("quick_product_finder", "search_products", "unavailable",
         "Find a product by name or keywords and return its product id and list price."),
    Look("legacy_return_policy", "get_after_sales_policy", "partial",
         "Get the return, exchange and refund policy from the help center (store-wide)."),
    Look("warranty_registry_lookup", "get_after_sales_policy", "unavailable",
         "Look up the warranty and after-sales terms registered for a product."),
    Look("track_parcel", "get_order_status", "unavailable",
         "Track the parcel of one of the viewer's orders by order number: carrier and "
         "delivery status."),
    Look("coupon_preview", "issue_coupon", "partial",
         "Preview the coupon campaigns of the live room and their eligibility rules."),
    Look("legacy_coupon_issuer", "issue_coupon", "unavailable",
         "Issue a store coupon to the viewer from the legacy coupon system."),
    Look("lottery_history", "get_lottery_status", "stale",
         "Get lottery information of the live room: prizes, winners and draw times."),
    Look("follower_gift_catalog", "claim_follow_gift", "partial",
         "List the gifts for followers of the live room and how to get them."),
)  # fmt: skip
_BY_NAME = {look.name: look for look in BANK}


def candidates(canonical: str) -> list[Look]:
    """The bank's look-alikes of canonical tool `canonical`, in bank order."""
    return [look for look in BANK if look.mimics == canonical]


def spec_data(look: Look, harness: hx.Harness) -> dict[str, Any]:
    """The item's record of a distractor: the `ToolSpec` fields, what it mimics, its answer."""
    base = harness.tool(look.mimics)
    if base is None:
        raise ValueError(f"distractor {look.name}: the Harness has no tool {look.mimics!r}")
    return {
        "name": look.name,
        "description": look.description,
        "category": base.category,
        "parameters": hx.thaw(base.parameters),
        "context_args": list(base.context_args),
        "mimics": look.mimics,
        "answer": look.answer,
    }


def with_distractors(
    harness: hx.Harness, distractors: Sequence[Mapping[str, Any]]
) -> hx.HarnessState:
    """The Harness state with `distractors` (`spec_data` records) added and validated.

    Each distractor goes right after the tool it mimics and into the `allowed_tools` of every
    Skill that allows that tool.

    Raises:
      ValueError: a distractor is unknown to the bank, clashes with an existing tool, or the
        resulting Harness fails `hx.validate` (the problems are listed).
    """
    tools = list(harness.tools)
    skills = list(harness.skills)
    for d in distractors:
        if d["name"] not in _BY_NAME:
            raise ValueError(f"unknown distractor {d['name']!r}; known: {sorted(_BY_NAME)}")
        if harness.tool(d["name"]) is not None:
            raise ValueError(f"distractor {d['name']!r} clashes with a tool of the Harness")
        spec = hx.ToolSpec(
            name=d["name"],
            description=d["description"],
            category=d["category"],
            parameters=d["parameters"],
            context_args=tuple(d["context_args"]),
        )
        at = next((i for i, t in enumerate(tools) if t.name == d["mimics"]), len(tools) - 1)
        tools.insert(at + 1, spec)
        skills = [
            dataclasses.replace(s, allowed_tools=(*s.allowed_tools, d["name"]))
            if d["mimics"] in s.allowed_tools
            else s
            for s in skills
        ]
    out = dataclasses.replace(harness, tools=tuple(tools), skills=tuple(skills))
    problems = hx.validate(out)
    if problems:
        raise ValueError(
            "the Harness with distractors "
            f"{[d['name'] for d in distractors]} is invalid: {[str(p) for p in problems]}"
        )
    return hx.HarnessState(harness=out)


# ---------------------------------------------------------------------------------- executors
def _product(world: livestream.World, args: Mapping[str, Any]) -> Mapping[str, Any]:
    pid = args.get("product_id")
    if not pid:
        raise hx.ToolError("a product_id is needed")
    return world.product(str(pid))


def _stale_price(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    p = _product(world, args)
    return {
        "product_id": p["id"],
        "name": p["name"],
        "list_price_2025_season": round(p["price"] * 1.25) + 3,
        "recorded_at": "2025-09-01",
        "note": "Legacy price list of the previous season; live-room prices and promotions "
        "are not included.",
    }


def _price_history(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    p = _product(world, args)
    return {
        "product_id": p["id"],
        "history": [
            {"date": "2025-06-18", "price": round(p["price"] * 1.3) + 7},
            {"date": "2025-11-11", "price": round(p["price"] * 1.2) + 1},
        ],
        "note": "Archived prices of past seasons only.",
    }


def _stale_stock(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    p = _product(world, args)
    return {
        "product_id": p["id"],
        "snapshot_taken": "2025-12-31T23:00:00",
        "units": {v: n + 41 for v, n in p["stock"].items()},
        "note": "Year-end snapshot; it does not reflect live-room sales.",
    }


def _restock(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    p = _product(world, args)
    return {"product_id": p["id"], "scheduled": [], "note": "No restock is scheduled."}


def _summary(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    p = _product(world, args)
    return {
        "product_id": p["id"],
        "brand": p["brand"],
        "category": p["category"],
        "variant_count": len(p["stock"]),
    }


def _archive(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "query": args.get("query", ""),
        "results": [],
        "note": "The archive lists discontinued products only.",
    }


def _return_summary(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "policy": "Returns and exchanges follow the terms shown on each product's page.",
        "note": "Store-wide summary from the help center; product terms are not included.",
    }


def _coupons(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    titles = [c.get("title", "") for c in world.room.get("campaigns", ())]
    return {"campaigns": titles, "note": "Preview only: no coupon was issued."}


def _lotteries(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "lotteries": [{"prize": "a canvas tote bag", "drawn_on": "2025-12-20", "status": "closed"}],
        "note": "Finished lotteries of earlier sessions.",
    }


def _gifts(world: livestream.World, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"gifts": [], "note": "Follower gifts change every session and are listed on air."}


_ANSWER: dict[str, Callable[[livestream.World, Mapping[str, Any]], Any]] = {
    "legacy_price_lookup": _stale_price,
    "get_price_history": _price_history,
    "archived_inventory_snapshot": _stale_stock,
    "check_restock_schedule": _restock,
    "product_catalog_summary": _summary,
    "search_catalog_archive": _archive,
    "legacy_return_policy": _return_summary,
    "coupon_preview": _coupons,
    "lottery_history": _lotteries,
    "follower_gift_catalog": _gifts,
}


def executor(name: str, world: livestream.World) -> Callable[[dict[str, Any]], Any]:
    """The sandbox executor of distractor `name` (on its canonical name, which is its own)."""
    look = _BY_NAME[name]
    answer = _ANSWER.get(name)
    if look.answer == "unavailable" or answer is None:
        message = f"{name.replace('_', ' ')} is not available for live rooms."
        return lambda args: {"status": "unavailable", "message": message}
    return lambda args: answer(world, args)


def toolbox(distractors: Sequence[Mapping[str, Any]], world: livestream.World) -> hx.Toolbox:
    """Executors of the item's distractors (in-memory, so inline)."""
    fns = {d["name"]: executor(d["name"], world) for d in distractors}
    return hx.Toolbox(fns, inline=fns)


_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])")


def leaks(result: Any, facts: Sequence[Fact]) -> list[str]:
    """The ids of `facts` (money, number, time or text) that a distractor's answer states."""
    text = json.dumps(result, ensure_ascii=False)
    numbers = {round(float(n), 2) for n in _NUMBER.findall(text)}
    out = []
    for f in facts:
        if f.kind in ("money", "number"):
            hit = round(float(f.value), 2) in numbers
        elif f.kind in ("time", "text"):
            hit = _facts.states(text, f.kind, f.value, f.ratio)
        else:
            continue
        if hit:
            out.append(f.id)
    return out
