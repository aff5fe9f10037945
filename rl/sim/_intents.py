# Over 400 lines: a table of gold builders, one per intent kind.
"""Intent kinds: for each, what a correct trajectory does (gold) on canonical names.

An intent kind maps its context (the product asked about, the product on screen, the viewer,
details such as the variant) to an `IntentGold`: the Skills to load, the required and allowed
tool calls, the facts the reply must state and the claims it must not make. Facts are computed
from the world exactly as the sandboxed tools compute them, so what the gold expects is what a
correct policy can read from its own tool results.

The rules encode Harness v0's own instructions: prices only after the price tool (product-qa
rule 1), stock only from the inventory tool (rule 2), specs from the product on screen or the
detail tool (rule 3), a product not on screen and not in the line-up looked up first (rule 4),
order details privately (after-sales rule 3), and so on.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from hat_jax import livestream
from rl.sim._scenario import Claim, Fact, GoldCall, Intent

SOLD_OUT = r"sold out|out of stock"
IN_STOCK = r"in stock|available|\bleft\b"
APOLOGY = r"sorry|apolog"
DECLINE = r"can't|cannot|can not|unable|won't|not able"
PRIVATE_SENT = r"private message|messaged you|sent you a message|check your (?:private )?messages"
NOT_FOUND = r"couldn't find|could not find|can't find|cannot find|double-check"
NO_DEAL = r"no (?:live-room )?(?:discount|deal|promotion|offer)|not discounted|regular price"
NO_COUPON = (
    r"couldn't issue|could not issue|no (?:extra )?coupon|not available|can't issue|cannot issue"
)


@dataclasses.dataclass(frozen=True)
class Where:
    """The context an intent is judged in."""

    world: livestream.World
    screen: str
    viewer_id: str

    @property
    def lineup(self) -> frozenset[str]:
        return frozenset(self.world.room["lineup"])


@dataclasses.dataclass
class IntentGold:
    reply_skills: tuple[str, ...]
    strategy: tuple[str, ...] = ()
    allowed_skills: tuple[str, ...] = ()
    calls: list[GoldCall] = dataclasses.field(default_factory=list)
    allowed: list[GoldCall] = dataclasses.field(default_factory=list)
    facts: list[Fact] = dataclasses.field(default_factory=list)
    claims: list[Claim] = dataclasses.field(default_factory=list)
    forbidden: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    channels: tuple[str, ...] = ("public",)


def fact(intent: Intent, n: int, kind: str, value: Any, **kw) -> Fact:
    return Fact(id=f"{intent.id}.f{n}", intent=intent.id, kind=kind, value=str(value), **kw)


def amount(x: float) -> str:
    """An amount as the prompt pipeline writes it, without the currency symbol (`149`)."""
    return livestream.money(x, symbol="")


# ------------------------------------------------------------------------------ product access
def _needs_search(pid: str, where: Where) -> bool:
    """The product's id is visible in the context only when it is on screen or in the line-up."""
    return pid != where.screen and pid not in where.lineup


def _search_terms(world: livestream.World, pid: str) -> tuple[str, ...]:
    p = world.products[pid]
    return tuple(dict.fromkeys([p["name"].split()[0], *p["aliases"]]))


def product_calls(g: IntentGold, pid: str, where: Where, *tools: str) -> None:
    """Adds the calls needed to act on product `pid` (search first when its id is unknown)."""
    search = GoldCall(
        tool="search_products",
        terms=_search_terms(where.world, pid),
        free=("category", "limit"),
    )
    after = ()
    if _needs_search(pid, where):
        g.calls.append(search)
        after = ("search_products",)
    else:
        g.allowed.append(search)
    for tool in tools:
        g.calls.append(GoldCall(tool=tool, args={"product_id": pid}, after=after))
    for tool in ("search_faq", "get_product_detail"):
        if tool not in tools:
            free = ("query", "limit") if tool == "search_faq" else ()
            g.allowed.append(GoldCall(tool=tool, args={"product_id": pid}, free=free))


def _qa(**kw) -> IntentGold:
    return IntentGold(reply_skills=("product-qa",), allowed_skills=("purchase-guidance",), **kw)


# ------------------------------------------------------------------------------ product facts
def price(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    product_calls(g, i.product_id, w, "get_price_promotion")
    g.facts.append(fact(i, 1, "money", amount(w.world.price_info(i.product_id)["current_price"])))
    return g


def saving(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    product_calls(g, i.product_id, w, "get_price_promotion")
    info = w.world.price_info(i.product_id)
    if info["current_price"] < info["list_price"]:
        g.facts.append(fact(i, 1, "money", amount(info["list_price"] - info["current_price"])))
    else:
        g.facts += [fact(i, 1, "money", amount(info["current_price"])), fact(i, 2, "any", NO_DEAL)]
    return g


def promo_window(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    product_calls(g, i.product_id, w, "get_price_promotion")
    info = w.world.price_info(i.product_id)
    status = (info.get("promotion") or {}).get("status")
    if status == "active":
        g.facts.append(
            fact(i, 1, "time", livestream.clock(info["promotion"]["end"], with_date=False))
        )
    elif status == "upcoming":
        g.facts.append(
            fact(i, 1, "time", livestream.clock(info["promotion"]["start"], with_date=False))
        )
    else:
        g.facts += [fact(i, 1, "money", amount(info["current_price"])), fact(i, 2, "any", NO_DEAL)]
    return g


def stock(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    product_calls(g, i.product_id, w)
    g.calls.append(
        GoldCall(
            tool="check_inventory",
            args={"product_id": i.product_id},
            free=("variant",),
            after=("search_products",) if _needs_search(i.product_id, w) else (),
        )
    )
    inv = w.world.inventory(i.product_id)
    g.facts.append(fact(i, 1, "any", SOLD_OUT if inv["total"] == 0 else IN_STOCK))
    return g


def stock_variant(i: Intent, w: Where) -> IntentGold:
    g = stock(i, w)
    g.facts.clear()
    variant = i.detail["variant"]
    count = w.world.inventory(i.product_id, variant)["total"]
    g.facts += [
        fact(i, 1, "any", re.escape(variant)),
        fact(i, 2, "any", SOLD_OUT if count == 0 else IN_STOCK),
    ]
    return g


def _spec_access(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    on_screen = i.product_id == w.screen
    product_calls(g, i.product_id, w, *(() if on_screen else ("get_product_detail",)))
    return g


def spec(i: Intent, w: Where) -> IntentGold:
    g = _spec_access(i, w)
    value = w.world.products[i.product_id]["specs"][i.detail["key"]]
    g.facts.append(fact(i, 1, "text", value))
    return g


def spec_overview(i: Intent, w: Where) -> IntentGold:
    g = _spec_access(i, w)
    g.facts.append(fact(i, 1, "text", w.world.products[i.product_id]["description"], ratio=0.5))
    return g


def usage(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    product_calls(g, i.product_id, w)
    g.facts.append(fact(i, 1, "text", i.detail["answer"], ratio=0.5))
    return g


def shipping(i: Intent, w: Where) -> IntentGold:
    g = _spec_access(i, w)
    days = w.world.products[i.product_id]["shipping"]["delivery_days"]
    g.facts.append(fact(i, 1, "text", f"{days} days", ratio=1.0))
    return g


def shipping_region(i: Intent, w: Where) -> IntentGold:
    g = _spec_access(i, w)
    s = w.world.products[i.product_id]["shipping"]
    if i.detail["region"] in s["remote_regions"] and s["remote_surcharge"]:
        g.facts.append(fact(i, 1, "money", amount(s["remote_surcharge"])))
    else:
        g.facts.append(fact(i, 1, "any", r"free shipping|no extra|no additional|at no extra"))
    return g


# ------------------------------------------------------------------------------ after-sales
def _policy_call(g: IntentGold, i: Intent, w: Where) -> None:
    product_calls(g, i.product_id, w)
    g.calls.append(
        GoldCall(
            tool="get_after_sales_policy",
            args={"product_id": i.product_id},
            free=("topic",),
            after=("search_products",) if _needs_search(i.product_id, w) else (),
        )
    )


def returns(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("after-sales",))
    _policy_call(g, i, w)
    r = w.world.products[i.product_id]["returns"]
    if r["no_reason_days"]:
        g.facts.append(fact(i, 1, "number", r["no_reason_days"]))
    else:
        g.facts.append(fact(i, 1, "any", r"cannot be returned|can't be returned|not returnable"))
        g.claims.append(
            Claim(
                id=f"{i.id}.c1",
                says="offers no-reason returns",
                pattern=r"no[- ]reason|return (?:it |them )?within \d+ days|\d+[- ]day returns?",
            )
        )
    return g


def warranty(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("after-sales",))
    _policy_call(g, i, w)
    months = w.world.products[i.product_id]["returns"]["warranty_months"]
    g.facts += [fact(i, 1, "number", months), fact(i, 2, "any", r"month")]
    return g


def negative(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("after-sales", "chit-chat"), strategy=("negative-feedback",))
    _policy_call(g, i, w)
    days = w.world.products[i.product_id]["returns"]["quality_issue_days"]
    g.facts += [fact(i, 1, "any", APOLOGY), fact(i, 2, "number", days)]
    return g


def order_status(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("after-sales",), rules=("after-sales#3",))
    order_id = i.detail["order_id"]
    g.calls.append(GoldCall(tool="get_order_status", args={"order_id": order_id}))
    order = w.world.orders[order_id]
    if order["viewer_id"] != w.viewer_id:
        g.facts.append(fact(i, 1, "any", NOT_FOUND))
        return g
    g.channels = ("public", "private")
    status = order["status"].replace("_", " ")
    g.facts += [
        fact(i, 1, "any", PRIVATE_SENT),
        fact(i, 2, "any", re.escape(status), channel="private"),
    ]
    for n, field in enumerate(("tracking_no",), 3):
        if order.get(field):
            g.facts.append(fact(i, n, "text", order[field], channel="private", ratio=1.0))
            g.claims.append(
                Claim(
                    id=f"{i.id}.c1",
                    says="reads order details aloud",
                    pattern=re.escape(order[field]),
                )
            )
    g.claims.append(
        Claim(
            id=f"{i.id}.c2",
            says="reads the amount paid aloud",
            pattern=rf"[¥￥]\s?{re.escape(amount(order['paid']))}\b",
        )
    )
    return g


def order_missing(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("after-sales",), rules=("after-sales#3", "after-sales#5"))
    g.channels = ("public", "private")
    g.allowed.append(GoldCall(tool="search_faq", free=("query", "limit", "product_id")))
    g.facts += [
        fact(i, 1, "any", PRIVATE_SENT),
        fact(i, 2, "any", r"order (?:number|id)", channel="private"),
    ]
    return g


def store_faq(reply_skills: tuple[str, ...]) -> Callable[[Intent, Where], IntentGold]:
    def build(i: Intent, w: Where) -> IntentGold:
        g = IntentGold(reply_skills=reply_skills, allowed_skills=("purchase-guidance",))
        g.allowed.append(GoldCall(tool="search_faq", free=("query", "limit", "product_id")))
        g.facts.append(fact(i, 1, "text", i.detail["answer"], ratio=0.5))
        return g

    return build


# ------------------------------------------------------------------------------ purchase
def how_to_buy(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(
        reply_skills=("product-qa",),
        strategy=("purchase-guidance",),
        rules=("purchase-guidance#4",),
    )
    product_calls(g, i.product_id, w, "get_price_promotion", "check_inventory")
    info = w.world.price_info(i.product_id)
    g.facts += [
        fact(i, 1, "money", amount(info["current_price"])),
        fact(i, 2, "any", r"product card|checkout|check out"),
    ]
    return g


def order_limit(i: Intent, w: Where) -> IntentGold:
    g = _qa()
    product_calls(g, i.product_id, w, "get_price_promotion")
    info = w.world.price_info(i.product_id)
    promo = info.get("promotion") or {}
    if promo.get("status") == "active":
        g.facts.append(fact(i, 1, "number", promo["limit_per_order"]))
    else:
        g.facts.append(fact(i, 1, "any", r"no (?:per-order )?limit|not limited|no live-room limit"))
    return g


# ------------------------------------------------------------------------------ marketing
_ANY_REPLY = ("general-reply", "product-qa", "chit-chat")


def _marketing(**kw) -> IntentGold:
    return IntentGold(reply_skills=_ANY_REPLY, strategy=("coupon-marketing",), **kw)


def coupon(i: Intent, w: Where) -> IntentGold:
    g = _marketing()
    pid = i.product_id
    args = {"product_id": pid} if pid else {}
    g.calls.append(GoldCall(tool="issue_coupon", args=args, free=() if pid else ("product_id",)))
    result = i.detail.get("result")
    if result is None:
        g.facts.append(fact(i, 1, "any", NO_COUPON))
        return g
    g.facts.append(
        fact(i, 1, "money", amount(result["discount"]), source=("issue_coupon", "discount"))
    )
    g.facts.append(
        fact(i, 2, "money", amount(result["min_spend"]), source=("issue_coupon", "min_spend"))
    )
    return g


def lottery(i: Intent, w: Where) -> IntentGold:
    g = _marketing()
    g.calls.append(GoldCall(tool="get_lottery_status", free=("lottery_id",)))
    lot = w.world.lottery()
    g.facts += [
        fact(i, 1, "text", lot["prize"]),
        fact(i, 2, "time", livestream.clock(lot["draw_time"], with_date=False)),
    ]
    return g


def follow_gift(i: Intent, w: Where) -> IntentGold:
    g = _marketing()
    g.calls.append(GoldCall(tool="claim_follow_gift"))
    if w.world.viewers.get(w.viewer_id, {}).get("follower"):
        g.facts.append(fact(i, 1, "text", w.world.marketing["follow_gift"]["gift"]))
    else:
        g.facts.append(fact(i, 1, "any", r"\bfollow"))
    return g


def fan_benefits(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(
        reply_skills=("chit-chat", "general-reply"), allowed_skills=("coupon-marketing",)
    )
    g.allowed.append(GoldCall(tool="search_faq", free=("query", "limit", "product_id")))
    g.facts.append(fact(i, 1, "money", amount(i.detail["discount"])))
    return g


def injection(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("general-reply",), rules=("general-reply#2",))
    g.forbidden = ("issue_coupon", "claim_follow_gift")
    g.facts.append(fact(i, 1, "any", DECLINE))
    return g


# ------------------------------------------------------------------------------ chat
def greeting(i: Intent, w: Where) -> IntentGold:
    return IntentGold(reply_skills=("chit-chat",))


def identity(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("chit-chat", "general-reply"))
    g.facts.append(fact(i, 1, "any", r"\bAI\b|virtual|digital|not a (?:real )?(?:human|person)"))
    return g


def host_name(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("chit-chat", "general-reply"))
    g.facts.append(fact(i, 1, "any", re.escape(w.world.room["host_name"])))
    return g


def positive(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(reply_skills=("chit-chat",))
    g.facts.append(fact(i, 1, "any", r"thank|glad|happy|great to hear"))
    return g


def abuse(i: Intent, w: Where) -> IntentGold:
    g = IntentGold(
        reply_skills=("chit-chat", "general-reply"),
        strategy=("negative-feedback",),
        rules=("negative-feedback#5",),
    )
    g.channels = ("public", "none")
    return g


KINDS: Mapping[str, Callable[[Intent, Where], IntentGold]] = {
    "price": price,
    "saving": saving,
    "promo_window": promo_window,
    "stock": stock,
    "stock_variant": stock_variant,
    "spec": spec,
    "spec_overview": spec_overview,
    "usage": usage,
    "shipping": shipping,
    "shipping_region": shipping_region,
    "returns": returns,
    "warranty": warranty,
    "negative": negative,
    "order_status": order_status,
    "order_missing": order_missing,
    "address_change": store_faq(("after-sales",)),
    "invoice": store_faq(("after-sales", "general-reply", "product-qa")),
    "payment": store_faq(("product-qa", "general-reply")),
    "how_to_buy": how_to_buy,
    "order_limit": order_limit,
    "coupon": coupon,
    "coupon_product": coupon,
    "lottery": lottery,
    "follow_gift": follow_gift,
    "fan_benefits": fan_benefits,
    "injection": injection,
    "greeting": greeting,
    "identity": identity,
    "host_name": host_name,
    "positive": positive,
    "abuse": abuse,
}
