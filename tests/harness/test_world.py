"""The bundled world: size, consistency of its facts, and the queries tools answer from."""

import json
import re
import shutil

import pytest

from hat_jax import harness as hx
from hat_jax import livestream


def test_catalog_size_and_fields(world):
    products = list(world.products.values())
    assert len(products) >= 40
    assert len({p["category"] for p in products}) >= 5
    for p in products:
        assert p["name"] and p["price"] > 0 and p["specs"] and p["faq"], p["id"]
        assert set(p["shipping"]) >= {"ships_within_hours", "carrier", "free_shipping"}
        assert set(p["returns"]) >= {"no_reason_days", "condition", "quality_issue_days"}
        if p["promotion"]:
            assert 0 < p["promotion"]["price"] < p["price"]
            assert p["promotion"]["start"] < p["promotion"]["end"]
    assert any(p.get("name_zh") for p in products)


def test_promotion_status_follows_the_stream_clock(world):
    assert world.price_info("BT-001")["promotion"]["status"] == "active"
    assert world.price_info("BT-001")["current_price"] == 149.0
    ended = world.price_info("BT-005")
    assert ended["promotion"]["status"] == "ended" and ended["current_price"] == ended["list_price"]
    upcoming = world.price_info("BT-007")
    assert upcoming["promotion"]["status"] == "upcoming" and upcoming["current_price"] == 89.0
    # After the early window closes (22:00) BT-003 is back at list price.
    assert world.price_info("BT-003", "2026-06-18T22:30:00+08:00")["current_price"] == 159.0


def test_anchor_utterances_agree_with_the_catalog_and_campaigns(world):
    """Everything the host already said on stream is backed by the world's own facts."""
    evidence = livestream.Evidence()
    evidence.add(hx.thaw(world.products))
    evidence.add(hx.thaw(world.marketing))
    for u in world.room["anchor_utterances"]:
        assert livestream.unsupported_claims(u["text"], evidence) == [], u["text"]


def test_faq_answers_state_no_prices(world):
    """Prices change with promotions, so FAQ answers never hard-code them."""
    for p in world.products.values():
        for f in p["faq"]:
            assert not re.search(r"[¥￥]\s?\d", f["a"]), (p["id"], f["a"])


def test_inventory_and_variants(world):
    trousers = world.inventory("AP-002")
    assert (
        trousers["stock"]["M"] == 0
        and trousers["total"] == 123
        and trousers["status"] == "in_stock"
    )
    assert world.inventory("AP-002", "m") == {**world.inventory("AP-002", "M")}
    night_cream = world.inventory("BT-006")
    assert night_cream["status"] == "sold_out" and night_cream["restock_date"] == "2026-06-25"
    with pytest.raises(hx.ToolError, match="no variant 'XXL'"):
        world.inventory("AP-002", "XXL")
    with pytest.raises(hx.ToolError, match="no product"):
        world.inventory("ZZ-999")


def test_orders_are_private_to_their_viewer(world):
    mine = world.order_status("DD2606150034", "v1001")
    assert mine["status"] == "shipped" and mine["product_name"].startswith("PowerCore")
    assert "viewer_id" not in mine
    with pytest.raises(hx.ToolError) as other:
        world.order_status("DD2606150034", "v1002")
    with pytest.raises(hx.ToolError) as absent:
        world.order_status("DD0000000000", "v1002")
    assert str(other.value).replace("DD2606150034", "X") == str(absent.value).replace(
        "DD0000000000", "X"
    )


def test_search_and_matching(world):
    hits = world.search_products("air fryer")["results"]
    assert hits[0]["product_id"] == "HK-002"
    assert world.search_products("earbuds", category="food")["results"] == []
    faq = world.search_faq("can I take it on a plane", "EL-002")["results"]
    assert "carry-on" in faq[0]["a"]
    assert world.match_products("这个口红多少钱") == ["BT-002"]
    assert world.match_products("is the serum good") == ["BT-001"]
    assert world.match_products("nothing here") == []


def test_make_request_builds_context(world):
    req = world.make_request(
        hx.Comment(text="how long does the air fryer take to ship?", viewer_id="v1003")
    )
    assert req.mode == "single" and req.viewer_id == "v1003"
    assert req.context.product["id"] == world.room["current_product"]
    assert {f["product_id"] for f in req.context.faq_pool} >= {"BT-001", "HK-002", None}
    assert req.context.room["campaigns"] and req.context.room["lottery"]["status"] == "open"
    assert "stock" not in req.context.product  # live stock comes from tools, not the prompt
    multi = world.make_request([hx.Comment(text="a"), hx.Comment(text="b")])
    assert multi.mode == "multi"
    with pytest.raises(ValueError, match="single-comment mode"):
        world.make_request([hx.Comment(text="a"), hx.Comment(text="b")], mode="single")


def _copy_world(world_dir, tmp_path):
    dest = tmp_path / "world"
    shutil.copytree(world_dir, dest)
    return dest


def test_inconsistent_world_is_refused_naming_file_and_field(world_dir, tmp_path):
    dest = _copy_world(world_dir, tmp_path)
    room = json.loads((dest / "room.json").read_text())
    room["current_product"] = "ZZ-404"
    room["active_campaigns"].append("CP-NOPE")
    (dest / "room.json").write_text(json.dumps(room))
    orders = json.loads((dest / "orders.json").read_text())
    orders["orders"][0]["variant"] = "1 litre"
    (dest / "orders.json").write_text(json.dumps(orders))
    with pytest.raises(livestream.WorldError) as err:
        livestream.load_world(dest)
    fields = {(p.file, p.field) for p in err.value.problems}
    assert ("room.json", "current_product") in fields
    assert ("room.json", "active_campaigns[4]") in fields
    assert ("orders.json", "orders[0].variant") in fields


def test_bad_catalog_values_and_json(world_dir, tmp_path):
    dest = _copy_world(world_dir, tmp_path)
    catalog = json.loads((dest / "catalog.json").read_text())
    catalog["products"][3]["promotion"] = {
        "price": 999,
        "label": "x",
        "start": "2026-06-18T20:00:00+08:00",
        "end": "2026-06-18T19:00:00+08:00",
        "limit_per_order": 1,
    }
    catalog["products"][5]["stock"] = {"50 g": -1}
    catalog["products"][6]["id"] = catalog["products"][7]["id"]
    (dest / "catalog.json").write_text(json.dumps(catalog))
    with pytest.raises(livestream.WorldError) as err:
        livestream.load_world(dest)
    text = str(err.value)
    assert "products[3].promotion.price" in text and "products[3].promotion.end" in text
    assert "products[5].stock.50 g" in text and "duplicate id" in text
    (dest / "viewers.json").write_text("{not json")
    with pytest.raises(
        livestream.WorldError, match=r"viewers.json: <json>: invalid JSON at line 1"
    ):
        livestream.load_world(dest)
