# Over 400 lines: a wording table, one entry per intent kind.
"""How the scripted teacher words a reply: one clause per intent, from tool results.

Every figure a clause states is read from a tool result (or the request context), never from
the gold, so the teacher is held to the same evidence rules as any policy. Each clause has a
full and a compact wording; `compose` uses the full one when the Harness's length limits
allow and the compact one otherwise, merging clauses into fewer sentences when the sentence
limit is tight. When a needed result is missing because a tool failed, the clause says so and
promises a follow-up instead of guessing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import harness as hx
from hat_jax import livestream
from rl.sim._scenario import Intent


@dataclasses.dataclass
class Results:
    """Tool results a policy has seen, by canonical tool: (arguments, value, status) with status
    ok, business (a `ToolError` answer such as "order not found"), fault or invalid."""

    items: list[tuple[str, Mapping[str, Any], Any, str]] = dataclasses.field(default_factory=list)

    def add(self, tool: str, args: Mapping[str, Any], value: Any) -> None:
        status = "ok"
        if isinstance(value, Mapping) and isinstance(value.get("error"), Mapping):
            kind = value["error"].get("type")
            status = "business" if kind == "tool_error" else "fault"
            if kind in ("invalid_arguments", "unknown_tool", "not_allowed", "rejected"):
                status = "invalid"
        elif not isinstance(value, Mapping):
            status = "fault"
        self.items.append((tool, dict(args), value, status))

    def _find(self, tool: str, statuses: tuple[str, ...], match: Mapping[str, Any]):
        for t, args, value, status in reversed(self.items):
            if t == tool and status in statuses and all(args.get(k) == v for k, v in match.items()):
                return value
        return None

    def ok(self, tool: str, **match) -> Any:
        """The latest successful result of `tool` whose arguments include `match`."""
        return self._find(tool, ("ok",), match)

    def answer(self, tool: str, **match) -> Any:
        """The latest result that is an answer: a success or a business error."""
        return self._find(tool, ("ok", "business"), match)

    def statuses(self, tool: str, **match) -> list[str]:
        return [
            s
            for t, args, _, s in self.items
            if t == tool and all(args.get(k) == v for k, v in match.items())
        ]


@dataclasses.dataclass(frozen=True)
class Clause:
    """What one intent contributes to the reply."""

    full: str
    compact: str = ""
    private: str | None = None
    unavailable: bool = False

    def text(self, compact: bool) -> str:
        return (self.compact or self.full) if compact else self.full


def _ack(topic: str) -> Clause:
    text = f"I can't check {topic} right now, we'll follow up in the comments shortly"
    return Clause(text, f"I can't check {topic} right now", unavailable=True)


def _name(world: livestream.World, pid: str) -> str:
    return world.products[pid]["name"]


# ------------------------------------------------------------------------------ product clauses
def _price(i: Intent, r: Results, world: livestream.World) -> Clause:
    p = r.ok("get_price_promotion", product_id=i.product_id)
    if p is None:
        return _ack("the price")
    name, promo = p["name"], p.get("promotion") or {}
    status = promo.get("status")
    if i.kind == "saving":
        if p["current_price"] < p["list_price"]:
            save = livestream.money(p["list_price"] - p["current_price"])
            return Clause(
                f"you save {save} on {name}: {livestream.money(p['current_price'])} instead of {livestream.money(p['list_price'])}",
                f"you save {save}",
            )
        return Clause(
            f"there's no discount on {name} right now, it's {livestream.money(p['current_price'])}"
        )
    if i.kind == "promo_window":
        if status == "active":
            return Clause(
                f"the live-room price of {livestream.money(p['current_price'])} for {name} runs until {livestream.clock(promo['end'], with_date=False)}",
                f"the deal runs until {livestream.clock(promo['end'], with_date=False)}",
            )
        if status == "upcoming":
            return Clause(
                f"the {promo['label']} for {name} starts at {livestream.clock(promo['start'], with_date=False)}"
            )
        return Clause(
            f"there's no live-room deal on {name} right now, it's {livestream.money(p['current_price'])}"
        )
    if i.kind == "order_limit":
        if status == "active":
            return Clause(
                f"you can buy up to {promo['limit_per_order']} per order at {livestream.money(p['current_price'])}",
                f"up to {promo['limit_per_order']} per order",
            )
        return Clause(f"there's no per-order limit on {name} right now")
    if status == "active":
        return Clause(
            f"{name} is {livestream.money(p['current_price'])} in the live room until {livestream.clock(promo['end'], with_date=False)}, "
            f"down from {livestream.money(p['list_price'])}",
            f"it's {livestream.money(p['current_price'])} tonight",
        )
    if status == "upcoming":
        return Clause(
            f"{name} is {livestream.money(p['list_price'])} now, and the {promo['label']} of "
            f"{livestream.money(promo['price'])} starts at {livestream.clock(promo['start'], with_date=False)}",
            f"it's {livestream.money(p['list_price'])} right now",
        )
    return Clause(
        f"{name} is {livestream.money(p['current_price'])}",
        f"it's {livestream.money(p['current_price'])}",
    )


def _stock(i: Intent, r: Results, world: livestream.World) -> Clause:
    v = r.ok("check_inventory", product_id=i.product_id)
    if v is None:
        return _ack("the stock")
    stock = v["stock"]
    if i.kind == "stock_variant":
        variant = i.detail["variant"]
        count = next((n for k, n in stock.items() if k.lower() == variant.lower()), None)
        if count is None:
            return _ack("that option")
        if count == 0:
            alts = [k for k, n in stock.items() if n][:2]
            more = (
                f", but {' and '.join(alts)} {'is' if len(alts) == 1 else 'are'} available"
                if alts
                else ""
            )
            return Clause(f"the {variant} is sold out{more}", f"{variant} is sold out")
        return Clause(f"yes, the {variant} is in stock ({count} left)", f"{variant} is in stock")
    if v["total"] == 0:
        restock = f", more is expected on {v['restock_date']}" if v.get("restock_date") else ""
        return Clause(f"{v['name']} is sold out right now{restock}", "it's sold out")
    return Clause(f"{v['name']} is in stock ({v['total']} left)", "it's in stock")


def _detail(i: Intent, r: Results, world: livestream.World) -> Mapping[str, Any] | None:
    """Product facts from the detail tool, or from the product block when it is on screen."""
    d = r.ok("get_product_detail", product_id=i.product_id)
    if d is not None:
        return d
    if i.detail.get("on_screen"):
        return world.product_detail(i.product_id)
    return None


_PLURAL = ("colours", "key ingredients", "shades", "ingredients", "allergens", "accessories")


def _spec(i: Intent, r: Results, world: livestream.World) -> Clause:
    d = _detail(i, r, world)
    if d is None:
        return _ack("the details")
    if i.kind == "spec_overview":
        desc = d["description"].rstrip(".")
        return Clause(
            f"{d['name']} is {desc[0].lower()}{desc[1:]}", f"it's {desc[0].lower()}{desc[1:]}"
        )
    key = i.detail["key"]
    verb = "are" if key in _PLURAL else "is"
    return Clause(
        f"the {key} of {d['name']} {verb} {d['specs'][key]}", f"its {key} {verb} {d['specs'][key]}"
    )


def _shipping(i: Intent, r: Results, world: livestream.World) -> Clause:
    d = _detail(i, r, world)
    if d is None:
        return _ack("the delivery details")
    s = d["shipping"]
    if i.kind == "shipping_region":
        region = i.detail["region"]
        if region in s["remote_regions"] and s["remote_surcharge"]:
            return Clause(
                f"yes, we ship {d['name']} to {region} for an extra {livestream.money(s['remote_surcharge'])}",
                f"{region} costs an extra {livestream.money(s['remote_surcharge'])}",
            )
        return Clause(
            f"yes, {d['name']} ships to {region} with free shipping", f"{region} has free shipping"
        )
    return Clause(
        f"{d['name']} ships within {s['ships_within_hours']} hours by {s['carrier']} and arrives in "
        f"{s['delivery_days']} days",
        f"it arrives in {s['delivery_days']} days",
    )


def _faq(i: Intent, r: Results, world: livestream.World) -> Clause:
    pid = i.product_id
    hits = r.ok("search_faq", product_id=pid) if pid else r.ok("search_faq")
    for h in (hits or {}).get("results", ()):
        if h["q"] == i.detail["question"]:
            return Clause(h["a"])
    return _ack("that")


# ------------------------------------------------------------------------------ service clauses
def _policy(i: Intent, r: Results, world: livestream.World) -> Clause:
    p = r.ok("get_after_sales_policy", product_id=i.product_id)
    if p is None or "policy" not in p:
        return _ack("the return policy")
    pol, name = p["policy"], p["name"]
    if i.kind == "warranty":
        return Clause(f"{name} comes with a {pol['warranty_months']}-month warranty")
    if i.kind == "negative":
        return Clause(
            f"so sorry about that! Quality issues with {name} are covered within "
            f"{pol['quality_issue_days']} days, please apply for a return or exchange on the order page",
            f"so sorry! Quality issues are covered within {pol['quality_issue_days']} days, apply on the order page",
        )
    if pol["no_reason_days"]:
        return Clause(
            f"you can return {name} within {pol['no_reason_days']} days if it is {pol['condition']}",
            f"returns within {pol['no_reason_days']} days if {pol['condition']}",
        )
    return Clause(pol["condition"])


def _order(i: Intent, r: Results, world: livestream.World) -> Clause:
    if i.kind == "order_missing":
        return Clause(
            "please check your private messages",
            private="Please send me your order number (it starts with DD) and I'll check it for you.",
        )
    o = r.answer("get_order_status", order_id=i.detail["order_id"])
    if o is None:
        return _ack("your order")
    if "error" in o:
        return Clause(
            f"I couldn't find order {i.detail['order_id']} under your account, please double-check the number",
            "I couldn't find that order, please double-check the number",
        )
    return Clause(
        "I've sent you a private message about your order", private=livestream.order_details(o)
    )


def _purchase(i: Intent, r: Results, world: livestream.World) -> Clause:
    p = r.ok("get_price_promotion", product_id=i.product_id)
    if p is None:
        return _ack("the price")
    return Clause(
        f"{p['name']} is {livestream.money(p['current_price'])} in the live room, just tap the product card "
        "under the stream, pick your option and check out",
        f"it's {livestream.money(p['current_price'])}, tap the product card and check out",
    )


def _marketing(i: Intent, r: Results, world: livestream.World) -> Clause:
    if i.kind in ("coupon", "coupon_product"):
        c = r.answer("issue_coupon")
        if c is None:
            return _ack("coupons")
        if "error" in c:
            return Clause(
                "I couldn't issue a coupon for you right now, but the live-room prices still apply"
            )
        granted = livestream.coupon_granted(c)
        return Clause(f"{granted}, it applies automatically at checkout", granted)
    if i.kind == "lottery":
        x = r.ok("get_lottery_status")
        if x is None:
            return _ack("the lottery")
        return Clause(
            f"the {x['prize']} lottery is drawn at {livestream.clock(x['draw_time'], with_date=False)}; to enter, {x['how_to_enter']}",
            f"the {x['prize']} lottery is drawn at {livestream.clock(x['draw_time'], with_date=False)}",
        )
    if i.kind == "follow_gift":
        g = r.answer("claim_follow_gift")
        if g is None:
            return _ack("the follower gift")
        if "error" in g:
            return Clause(
                "the follower gift is for followers, so tap follow first and ask me again"
            )
        return Clause(
            f"your follower gift, {g['gift']}, is on its way: it {g['delivery']}",
            f"your gift, {g['gift']}, is on its way",
        )
    return Clause(
        f"followers can get a {livestream.money(i.detail['discount'])} off coupon with no minimum spend, just ask me for it",
        f"followers get a {livestream.money(i.detail['discount'])} off coupon",
    )


_CHAT = {
    "greeting": "welcome to the live room, great to have you here!",
    "identity": "I'm {host}, the AI host of this live room, here to help you shop!",
    "host_name": "I'm {host}, your AI host tonight!",
    "positive": "thank you so much, so glad you love it!",
    "abuse": "sorry you feel that way, more deals are coming up, so stay tuned!",
    "injection": "I can't change my rules or share internal instructions, but I'm happy to help with the products!",
}


def clause(i: Intent, r: Results, world: livestream.World) -> Clause:
    """The clause that answers intent `i` given the results seen so far."""
    if i.kind in _CHAT:
        return Clause(_CHAT[i.kind].format(host=world.room["host_name"]))
    for kinds, fn in _DISPATCH:
        if i.kind in kinds:
            return fn(i, r, world)
    raise ValueError(f"no clause for intent kind {i.kind!r}")


_DISPATCH = (
    (("price", "saving", "promo_window", "order_limit"), _price),
    (("stock", "stock_variant"), _stock),
    (("spec", "spec_overview"), _spec),
    (("shipping", "shipping_region"), _shipping),
    (("usage", "payment", "invoice", "address_change"), _faq),
    (("returns", "warranty", "negative"), _policy),
    (("order_status", "order_missing"), _order),
    (("how_to_buy",), _purchase),
    (("coupon", "coupon_product", "lottery", "follow_gift", "fan_benefits"), _marketing),
)


# ------------------------------------------------------------------------------ the reply
def lead(handles: Sequence[str]) -> str:
    names = [f"@{h}" for h in dict.fromkeys(handles)]
    return (", ".join(names[:-1]) + " and " + names[-1]) if len(names) > 1 else names[0]


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text[-1:] in ".!?" else text + "."


def join(head: str, parts: Sequence[str], max_sentences: int) -> str:
    """`head, part one. Part two.`: parts become sentences, merged with '; ' (from the end)
    while the text has more than `max_sentences` sentences and there is something to merge."""
    parts = list(dict.fromkeys(p.strip() for p in parts if p.strip()))

    def render(ps: list[str]) -> str:
        out = [_sentence(p) for p in ps]
        out[1:] = [s[0].upper() + s[1:] for s in out[1:]]
        return f"{head}, {out[0]}" + "".join(f" {s}" for s in out[1:])

    while len(parts) > 1 and sentences(render(parts)) > max_sentences:
        a, b = parts[-2], parts[-1]
        parts[-2:] = [f"{a.rstrip('.!')}; {b[0].lower()}{b[1:]}"]
    return render(parts)


def compose(
    clauses: Sequence[Clause],
    handles: Sequence[str],
    *,
    max_chars: int,
    max_sentences: int,
    strict: bool = True,
) -> tuple[str, str | None]:
    """The public reply (and private message, if any) within the given limits.

    Args:
      strict: if the compact wording does not fit either, raise (True) or drop clauses from
        the end until it fits (False: what a policy does when a tool failure made its answer
        longer than planned; the dropped intents then count as missed).

    Raises:
      ValueError: `strict` and even the compact wording does not fit `max_chars`.
    """
    head = lead(handles)
    private = " ".join(c.private for c in clauses if c.private) or None
    for compact in (False, True):
        text = join(head, [c.text(compact) for c in clauses], max_sentences)
        if len(text) <= max_chars and len(hx.to_speech(text)[0]) == len(text):
            return text, private
    if strict:
        raise ValueError(f"reply does not fit {max_chars} characters: {text!r}")
    parts = [c.text(True) for c in clauses]
    while len(parts) > 1 and len(join(head, parts, max_sentences)) > max_chars:
        parts.pop()
    text = join(head, parts, max_sentences)
    return (text if len(text) <= max_chars else text[:max_chars].rsplit(" ", 1)[0]), private


def sentences(text: str) -> int:
    return len([s for s in re.split(r"(?<=[.!?。！？])\s+", text.strip()) if s])
