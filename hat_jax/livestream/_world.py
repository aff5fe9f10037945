"""The bundled live-commerce world: catalog, live room, orders, viewers, marketing campaigns.

`World` is read-only data with the queries the built-in tools, the prompt pipeline and the
marketing service answer from. Every answer is computed from the files, so the simulator and the
rewards can check a reply against exactly the same facts. Time is the stream clock in
`room.json` (`now`), not the wall clock, so promotions and lotteries are reproducible.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hat_jax.harness import (
    Comment,
    FrozenDict,
    HarnessError,
    Problem,
    Request,
    RequestContext,
    ToolError,
    freeze,
    rank_faq,
    thaw,
    tokens,
)

_PRODUCT_ID = re.compile(r"^[A-Z]{2}-\d{3}$")


class WorldError(HarnessError):
    """The world files are inconsistent; `.problems` names each file and field."""


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


def _promotion_status(promo: Mapping | None, now: dt.datetime) -> str | None:
    if not promo:
        return None
    if now < parse_time(promo["start"]):
        return "upcoming"
    return "active" if now <= parse_time(promo["end"]) else "ended"


@dataclasses.dataclass(frozen=True)
class World:
    """Read-only world data (see `load_world`). Products, orders and viewers are keyed by id."""

    root: str
    store: Mapping[str, Any]
    products: Mapping[str, Mapping[str, Any]]
    store_faq: tuple[Mapping[str, Any], ...]
    after_sales: Mapping[str, Any]
    orders: Mapping[str, Mapping[str, Any]]
    viewers: Mapping[str, Mapping[str, Any]]
    marketing: Mapping[str, Any]
    room: Mapping[str, Any]

    @property
    def now(self) -> dt.datetime:
        return parse_time(self.room["now"])

    def _now(self, now: str | dt.datetime | None) -> dt.datetime:
        if now is None or now == "":
            return self.now
        return parse_time(now) if isinstance(now, str) else now

    def product(self, product_id: str) -> Mapping[str, Any]:
        if product_id not in self.products:
            raise ToolError(f"no product with id {product_id!r}")
        return self.products[product_id]

    # ----------------------------------------------------------------- retrieval
    def search_products(self, query: str, category: str | None = None, limit: int = 5) -> dict:
        q = set(tokens(query))
        scored = []
        for p in self.products.values():
            if category and p["category"] != category:
                continue
            strong = set(tokens(" ".join([p["name"], p.get("name_zh", ""), *p["aliases"]])))
            weak = set(tokens(" ".join([p["brand"], p["category"], p["description"]])))
            score = 2 * len(q & strong) + len(q & weak)
            if score:
                scored.append((-score, p["id"]))
        hits = [self.products[pid] for _, pid in sorted(scored)[:limit]]
        return {
            "query": query,
            "results": [
                {
                    "product_id": p["id"],
                    "name": p["name"],
                    "category": p["category"],
                    "list_price": p["price"],
                }
                for p in hits
            ],
        }

    def product_detail(self, product_id: str) -> dict:
        p = thaw(self.product(product_id))
        return {
            "product_id": p["id"],
            **{k: p[k] for k in ("name", "brand", "category", "description", "specs")},
            "variants": sorted(p["stock"]),
            "shipping": p["shipping"],
            "returns": p["returns"],
        }

    def search_faq(self, query: str, product_id: str | None = None, limit: int = 3) -> dict:
        pool = self.product(product_id)["faq"] if product_id else self.store_faq
        hits = rank_faq(query, pool, limit)
        return {"product_id": product_id, "results": [thaw(h) for h in hits]}

    # ----------------------------------------------------------------- commerce
    def inventory(self, product_id: str, variant: str | None = None) -> dict:
        p = self.product(product_id)
        stock = dict(p["stock"])
        if variant is not None:
            match = next((v for v in stock if v.lower() == variant.strip().lower()), None)
            if match is None:
                raise ToolError(
                    f"{p['name']} has no variant {variant!r}; variants: {', '.join(stock)}"
                )
            stock = {match: stock[match]}
        total = sum(stock.values())
        out = {
            "product_id": p["id"],
            "name": p["name"],
            "stock": stock,
            "total": total,
            "status": "sold_out" if total == 0 else "low_stock" if total < 20 else "in_stock",
        }
        if p.get("restock_date") and total == 0:
            out["restock_date"] = p["restock_date"]
        return out

    def price_info(self, product_id: str, now: str | dt.datetime | None = None) -> dict:
        p = self.product(product_id)
        promo = p["promotion"]
        status = _promotion_status(promo, self._now(now))
        out = {
            "product_id": p["id"],
            "name": p["name"],
            "currency": self.store["currency"],
            "list_price": p["price"],
            "current_price": promo["price"] if status == "active" else p["price"],
        }
        if promo:
            out["promotion"] = {**thaw(promo), "status": status}
        return out

    def order_status(self, order_id: str, viewer_id: str) -> dict:
        order = self.orders.get(order_id)
        if order is None or order["viewer_id"] != viewer_id:
            # Same answer for "absent" and "someone else's": order ids must not leak.
            raise ToolError(f"no order {order_id} found for this viewer")
        out = {k: v for k, v in thaw(order).items() if k != "viewer_id" and v is not None}
        out["product_name"] = self.products[order["product_id"]]["name"]
        return out

    def after_sales_policy(self, product_id: str | None = None, topic: str | None = None) -> dict:
        out: dict[str, Any] = {"general": thaw(self.after_sales["general"])}
        if product_id:
            p = self.product(product_id)
            out.update(
                product_id=p["id"],
                name=p["name"],
                category=p["category"],
                policy=thaw(p["returns"]),
            )
        if topic:
            out["topic"] = topic
        return out

    # ----------------------------------------------------------------- marketing data
    def campaign_active(self, campaign: Mapping, now: dt.datetime | None = None) -> bool:
        now = self._now(now)
        return parse_time(campaign["start"]) <= now <= parse_time(campaign["end"])

    def lottery(self, lottery_id: str | None = None, now: dt.datetime | None = None) -> dict:
        lid = lottery_id or self.room.get("active_lottery")
        lot = next((x for x in self.marketing["lotteries"] if x["lottery_id"] == lid), None)
        if lot is None:
            raise ToolError(f"no lottery {lid!r}")
        out = thaw(lot)
        out["status"] = "drawn" if self._now(now) >= parse_time(lot["draw_time"]) else "open"
        if out["status"] == "open":
            out.pop("winner_handles", None)
        return out

    # ----------------------------------------------------------------- requests
    def match_products(self, text: str) -> list[str]:
        """Ids of products a text mentions by name, Chinese name or alias (in its first 2,000
        characters: raw comments are untrusted and may be huge)."""
        low, found = text[:2000].lower(), []
        for p in self.products.values():
            for alias in (p["name"], p.get("name_zh", ""), *p["aliases"]):
                a = alias.lower()
                if a and (
                    re.search(rf"(?<![a-z0-9]){re.escape(a)}(?![a-z0-9])", low)
                    if a.isascii()
                    else a in low
                ):
                    found.append(p["id"])
                    break
        return found

    def room_view(self, now: dt.datetime | None = None) -> dict:
        """The live-room state as the prompt pipeline shows it (campaigns and lottery expanded)."""
        room, now = thaw(self.room), self._now(now)
        campaigns = [
            {k: c[k] for k in ("campaign_id", "title", "followers_only", "remaining")}
            for c in self.marketing["coupon_campaigns"]
            if c["campaign_id"] in room["active_campaigns"] and self.campaign_active(c, now)
        ]
        lottery = (
            self.lottery(room.get("active_lottery"), now) if room.get("active_lottery") else None
        )
        return {
            **{
                k: room[k]
                for k in ("room_id", "title", "host_name", "now", "session", "viewer_count")
            },
            "currency_symbol": self.store["currency_symbol"],
            "current_product": {
                "product_id": room["current_product"],
                "name": self.products[room["current_product"]]["name"],
            },
            "lineup": [{"product_id": i, "name": self.products[i]["name"]} for i in room["lineup"]],
            "campaigns": campaigns,
            "lottery": lottery,
            "anchor_utterances": room["anchor_utterances"][-3:],
        }

    def product_view(self, product_id: str, now: dt.datetime | None = None) -> dict:
        """The product-spec block: static facts, promotion with its status; no live stock."""
        p = thaw(self.product(product_id))
        p["promotion"] = self.price_info(product_id, now).get("promotion")
        p.pop("faq", None)
        p.pop("stock", None)
        p["variants"] = sorted(self.products[product_id]["stock"])
        return p

    def make_request(
        self,
        comments: Sequence[Comment] | Comment | str,
        *,
        mode: str | None = None,
        history: Iterable[Mapping[str, Any]] = (),
        product_id: str | None = None,
        request_id: str = "req-0",
    ) -> Request:
        """Builds a `Request` with the context the prompt pipeline needs.

        The product block shows `product_id`, else the product on screen. The FAQ pool holds the
        FAQ of that product, of products the comments mention, and the store-wide FAQ.
        """
        if isinstance(comments, str):
            comments = Comment(text=comments)
        if isinstance(comments, Comment):
            comments = (comments,)
        comments = tuple(comments)
        mode = mode or ("multi" if len(comments) > 1 else "single")
        pid = product_id or self.room["current_product"]
        mentioned = [m for c in comments for m in self.match_products(c.text)]
        pool = [
            dict(f, product_id=i)
            for i in dict.fromkeys([pid, *mentioned])
            for f in thaw(self.products[i]["faq"])
        ]
        pool += [dict(f, product_id=None) for f in thaw(self.store_faq)]
        ctx = RequestContext(
            room=self.room_view(),
            product=self.product_view(pid),
            faq_pool=tuple(pool),
            history=tuple(history),
        )
        return Request(request_id=request_id, comments=comments, mode=mode, context=ctx)


def _read_json(root: pathlib.Path, name: str, problems: list[Problem]) -> Any:
    try:
        return json.loads((root / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(Problem(name, "<file>", f"missing (looked in {root})"))
    except json.JSONDecodeError as err:
        problems.append(
            Problem(
                name, "<json>", f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
            )
        )
    return None


def load_world(directory: str | pathlib.Path) -> World:
    """Loads and cross-checks a world folder (`catalog.json`, `room.json`, `orders.json`,
    `viewers.json`, `marketing.json`, `after_sales.json`).

    Raises:
      WorldError: every inconsistency, naming file and field.
    """
    from hat_jax.livestream._world_check import check_world

    root = pathlib.Path(directory)
    problems: list[Problem] = []
    data = {
        n: _read_json(root, f"{n}.json", problems)
        for n in ("catalog", "room", "orders", "viewers", "marketing", "after_sales")
    }
    if not problems:
        problems += check_world(data)
    if problems:
        raise WorldError(problems)
    catalog = data["catalog"]
    return World(
        root=str(root),
        store=freeze({k: v for k, v in catalog.items() if k not in ("products", "store_faq")}),
        products=FrozenDict({p["id"]: freeze(p) for p in catalog["products"]}),
        store_faq=freeze(catalog.get("store_faq", [])),
        after_sales=freeze(data["after_sales"]),
        orders=FrozenDict({o["order_id"]: freeze(o) for o in data["orders"]["orders"]}),
        viewers=FrozenDict({v["viewer_id"]: freeze(v) for v in data["viewers"]["viewers"]}),
        marketing=freeze(data["marketing"]),
        room=freeze(data["room"]),
    )
