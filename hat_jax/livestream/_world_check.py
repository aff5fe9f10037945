"""Consistency checks of the world files: every id a file refers to exists, prices, windows and
stock make sense. The simulator and the rewards score replies against these facts, so an
inconsistent world is refused at load time rather than producing contradictory gold answers.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from hat_jax.harness import Problem

_PRODUCT_ID = re.compile(r"^[A-Z]{2}-\d{3}$")


def _time(value: Any, file: str, field: str, problems: list[Problem]) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        problems.append(Problem(file, field, f"not an ISO-8601 time: {value!r}"))
        return None
    if t.tzinfo is None:
        problems.append(Problem(file, field, f"time {value!r} needs a UTC offset"))
    return t


def _window(obj: Mapping, file: str, field: str, problems: list[Problem]) -> None:
    start = _time(obj.get("start"), file, f"{field}.start", problems)
    end = _time(obj.get("end"), file, f"{field}.end", problems)
    if start and end and start.tzinfo and end.tzinfo and start >= end:
        problems.append(Problem(file, f"{field}.end", "must be after start"))


def _check_product(p: Any, i: int, categories, problems: list[Problem]) -> None:
    f, path = "catalog.json", f"products[{i}]"
    if not isinstance(p, Mapping):
        problems.append(Problem(f, path, "expected an object"))
        return
    for key, types in (
        ("id", str),
        ("name", str),
        ("category", str),
        ("brand", str),
        ("price", (int, float)),
        ("stock", Mapping),
        ("specs", Mapping),
        ("shipping", Mapping),
        ("returns", Mapping),
        ("faq", list),
        ("aliases", list),
        ("description", str),
    ):
        if not isinstance(p.get(key), types):
            problems.append(
                Problem(
                    f, f"{path}.{key}", f"missing or not a {getattr(types, '__name__', 'number')}"
                )
            )
    if problems and problems[-1].field.startswith(path + "."):
        return
    if not _PRODUCT_ID.match(p["id"]):
        problems.append(Problem(f, f"{path}.id", f"{p['id']!r} is not like 'BT-001'"))
    if p["category"] not in categories:
        problems.append(Problem(f, f"{path}.category", f"unknown category {p['category']!r}"))
    if p["price"] <= 0:
        problems.append(Problem(f, f"{path}.price", "must be positive"))
    for variant, n in p["stock"].items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            problems.append(
                Problem(f, f"{path}.stock.{variant}", f"must be a non-negative integer, got {n!r}")
            )
    promo = p.get("promotion")
    if promo is not None:
        if not isinstance(promo.get("price"), int | float) or not 0 < promo["price"] < p["price"]:
            problems.append(
                Problem(f, f"{path}.promotion.price", "must be positive and below the list price")
            )
        _window(promo, f, f"{path}.promotion", problems)
    for j, entry in enumerate(p["faq"]):
        if not (
            isinstance(entry, Mapping)
            and isinstance(entry.get("q"), str)
            and isinstance(entry.get("a"), str)
        ):
            problems.append(Problem(f, f"{path}.faq[{j}]", "needs string fields 'q' and 'a'"))


def check_world(data: Mapping[str, Any]) -> list[Problem]:
    """Returns every problem found across the world files (empty when consistent)."""
    problems: list[Problem] = []
    catalog, room, marketing = data["catalog"], data["room"], data["marketing"]
    categories = catalog.get("categories", {})
    products = catalog.get("products", [])
    ids: dict[str, int] = {}
    for i, p in enumerate(products):
        _check_product(p, i, categories, problems)
        pid = p.get("id") if isinstance(p, Mapping) else None
        if pid in ids:
            problems.append(
                Problem(
                    "catalog.json",
                    f"products[{i}].id",
                    f"duplicate id {pid!r} (also products[{ids[pid]}])",
                )
            )
        ids.setdefault(pid, i)
    stock = {
        p["id"]: p["stock"]
        for p in products
        if isinstance(p, Mapping) and isinstance(p.get("stock"), Mapping)
    }
    viewers = {v.get("viewer_id") for v in data["viewers"].get("viewers", [])}
    campaigns = {c.get("campaign_id"): c for c in marketing.get("coupon_campaigns", [])}
    lotteries = {x.get("lottery_id") for x in marketing.get("lotteries", [])}
    for i, c in enumerate(campaigns.values()):
        _window(c, "marketing.json", f"coupon_campaigns[{i}]", problems)
        scope = c.get("scope", {})
        if scope.get("type") == "category" and scope.get("category") not in categories:
            problems.append(
                Problem(
                    "marketing.json",
                    f"coupon_campaigns[{i}].scope.category",
                    f"unknown category {scope.get('category')!r}",
                )
            )
    for i, x in enumerate(marketing.get("lotteries", [])):
        _time(x.get("draw_time"), "marketing.json", f"lotteries[{i}].draw_time", problems)
    _time(room.get("now"), "room.json", "now", problems)
    for field in ("current_product",):
        if room.get(field) not in ids:
            problems.append(Problem("room.json", field, f"unknown product {room.get(field)!r}"))
    for j, pid in enumerate(room.get("lineup", [])):
        if pid not in ids:
            problems.append(Problem("room.json", f"lineup[{j}]", f"unknown product {pid!r}"))
    for j, cid in enumerate(room.get("active_campaigns", [])):
        if cid not in campaigns:
            problems.append(
                Problem("room.json", f"active_campaigns[{j}]", f"unknown campaign {cid!r}")
            )
    if room.get("active_lottery") and room["active_lottery"] not in lotteries:
        problems.append(
            Problem("room.json", "active_lottery", f"unknown lottery {room['active_lottery']!r}")
        )
    for i, o in enumerate(data["orders"].get("orders", [])):
        path = f"orders[{i}]"
        if o.get("product_id") not in ids:
            problems.append(
                Problem(
                    "orders.json", f"{path}.product_id", f"unknown product {o.get('product_id')!r}"
                )
            )
        elif o.get("variant") not in stock.get(o["product_id"], {}):
            problems.append(
                Problem(
                    "orders.json",
                    f"{path}.variant",
                    f"{o.get('variant')!r} is not a variant of {o['product_id']}",
                )
            )
        if o.get("viewer_id") not in viewers:
            problems.append(
                Problem(
                    "orders.json", f"{path}.viewer_id", f"unknown viewer {o.get('viewer_id')!r}"
                )
            )
    return problems
