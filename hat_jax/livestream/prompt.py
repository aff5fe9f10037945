"""The live room's prompt context blocks (`BLOCKS`: `product` and `room`), named by Harness
v0's prompt.yaml `libraries`, and how the room writes amounts and times (`money`, `clock`): the
prompt, the rule-based policy and the simulator's teacher all speak figures this way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from hat_jax.harness import ContextBlocks, RequestContext

BLOCKS = ContextBlocks("hat_jax.livestream.prompt")


def money(value: float, symbol: str = "¥") -> str:
    """`149.0` -> `¥149`, `12.5` -> `¥12.5`."""
    return f"{symbol}{value:g}"


def clock(iso: str, with_date: bool = True) -> str:
    t = dt.datetime.fromisoformat(iso)
    return t.strftime("%Y-%m-%d %H:%M" if with_date else "%H:%M")


def _product_items(p: Mapping[str, Any], sym: str) -> list[str]:
    name = p["name"] + (f" ({p['name_zh']})" if p.get("name_zh") else "")
    items = [
        f"ID: {p['id']}",
        f"Name: {name}",
        f"Brand: {p['brand']}",
        f"List price: {money(p['price'], sym)}",
    ]
    promo = p.get("promotion")
    if promo:
        items.append(
            f"Promotion ({promo['status']}): {money(promo['price'], sym)} {promo['label']}, "
            f"{clock(promo['start'])} to {clock(promo['end'])}, limit {promo['limit_per_order']} per order"
        )
    items.append("Variants: " + ", ".join(p["variants"]))
    items.append("Specs: " + "; ".join(f"{k}: {v}" for k, v in p["specs"].items()))
    s = p["shipping"]
    remote = (
        f"; {', '.join(s['remote_regions'])} +{money(s['remote_surcharge'], sym)}"
        if s["remote_regions"]
        else ""
    )
    items.append(
        f"Shipping: ships within {s['ships_within_hours']} hours by {s['carrier']}, "
        f"{'free shipping' if s['free_shipping'] else 'shipping charged'}, delivery in {s['delivery_days']} days{remote}"
    )
    r = p["returns"]
    window = (
        f"{r['no_reason_days']}-day no-reason returns"
        if r["no_reason_days"]
        else "no no-reason returns"
    )
    items.append(
        f"Returns: {window} ({r['condition']}); quality issues within {r['quality_issue_days']} days; {r['return_shipping']}"
    )
    return items


def _room_items(room: Mapping[str, Any]) -> list[str]:
    items = [f"Time now: {clock(room['now'])}"]
    if room.get("session"):
        items.append(
            f"Live session: {clock(room['session']['start'])} to {clock(room['session']['end'])}"
        )
    if room.get("viewer_count") is not None:
        items.append(f"Viewers online: {room['viewer_count']}")
    if room.get("lineup"):
        items.append(
            "Line-up: " + ", ".join(f"{x['name']} [{x['product_id']}]" for x in room["lineup"])
        )
    for c in room.get("campaigns", ()):
        notes = [
            " (followers only)" if c["followers_only"] else "",
            " (fully claimed)" if c["remaining"] == 0 else "",
        ]
        items.append(f"Coupon campaign: {c['title']}{''.join(notes)}")
    lot = room.get("lottery")
    if lot:
        items.append(
            f"Lottery ({lot['status']}): {lot['prize']} for {lot['winners']} winners, draw at "
            f"{clock(lot['draw_time'], with_date=False)}; to enter, {lot['how_to_enter']}"
        )
    items += [
        f'Host said at {clock(u["at"], with_date=False)}: "{u["text"]}"'
        for u in room.get("anchor_utterances", ())
    ]
    return items


@BLOCKS.block("product")
def product_block(ctx: RequestContext) -> list[str]:
    """The product on screen: price, promotion, variants, specs, shipping, returns."""
    if not ctx.product:
        return ["(no product on screen)"]
    return _product_items(ctx.product, ctx.room.get("currency_symbol", "¥"))


@BLOCKS.block("room")
def room_block(ctx: RequestContext) -> list[str]:
    """The live room: time, session, line-up, campaigns, lottery, what the host said."""
    if not ctx.room:
        return ["(no live-room state)"]
    return _room_items(ctx.room)


def _shipping_brief(s: Mapping[str, Any], sym: str) -> str:
    fee = "free" if s["free_shipping"] else "charged"
    remote = (
        f"; {', '.join(s['remote_regions'])} +{money(s['remote_surcharge'], sym)}"
        if s["remote_regions"] and s["remote_surcharge"]
        else ""
    )
    return f"Shipping: {s['carrier']}, {fee}, {s['delivery_days']} days{remote}"


@BLOCKS.block("product_brief")
def product_brief_block(ctx: RequestContext) -> list[str]:
    """The product on screen in a few lines (the micro room): id and name, description, specs
    and shipping; no prices, which come from the price tool."""
    if not ctx.product:
        return ["(no product on screen)"]
    p, sym = ctx.product, ctx.room.get("currency_symbol", "¥")
    return [
        f"{p['id']}: {p['name']}",
        f"About: {p['description']}",
        "Specs: " + "; ".join(f"{k}: {v}" for k, v in p["specs"].items()),
        _shipping_brief(p["shipping"], sym),
    ]


@BLOCKS.block("room_brief")
def room_brief_block(ctx: RequestContext) -> list[str]:
    """The live room in a few lines (the micro room): the clock and the coupon campaigns."""
    if not ctx.room:
        return ["(no live-room state)"]
    room = ctx.room
    items = [f"Time now: {clock(room['now'])}"]
    for c in room.get("campaigns", ()):
        if c["remaining"] == 0:
            continue
        items.append(f"Coupon: {c['title']}" + (" (followers only)" if c["followers_only"] else ""))
    return items
