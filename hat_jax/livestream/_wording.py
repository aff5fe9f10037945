"""How the host words a tool result the same way whoever composes the reply: the offline
rule-based policy and the simulator's scripted teacher (`rl.sim`) share these phrases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hat_jax.livestream.prompt import money


def order_details(order: Mapping[str, Any]) -> str:
    """The private message about an order: status, tracking and expected delivery."""
    status = order["status"].replace("_", " ")
    details = [f"Order {order['order_id']} ({order['product_name']}) is {status}."]
    if order.get("tracking_no"):
        details.append(f"Tracking: {order['carrier']} {order['tracking_no']}.")
    if order.get("eta"):
        details.append(f"Expected delivery: {order['eta']}.")
    return " ".join(details)


def coupon_granted(coupon: Mapping[str, Any]) -> str:
    """`you got a ¥20 off coupon on orders of ¥199 or more` from `issue_coupon`'s result."""
    spend = (
        f" on orders of {money(coupon['min_spend'])} or more"
        if coupon["min_spend"]
        else " with no minimum spend"
    )
    return f"you got a {money(coupon['discount'])} off coupon{spend}"
