"""Sandboxed executors: the same answers as the real services, faults at configured rates."""

import contextlib

import pytest

from hat_jax import harness as hx
from hat_jax import livestream
from rl import sim


def test_marketing_sandbox_matches_the_mcp_service(world, base):
    """Every viewer (and a guest) asks for a coupon for several products and the follower gift
    twice; the sandbox and the bundled MCP server (through the real SDK) agree on each answer."""

    def answers(call):
        out = []
        for viewer in [*sorted(world.viewers), "guest_1"]:
            for pid in (None, "BT-001", "EL-003", "FD-001"):
                args = {"viewer_id": viewer, **({"product_id": pid} if pid else {})}
                out.append(call("issue_coupon", args))
            out += [call("claim_follow_gift", {"viewer_id": viewer}) for _ in range(2)]
        out.append(call("get_lottery_status", {}))
        out.append(call("get_lottery_status", {"lottery_id": "LT-0618-2000"}))
        return out

    def outcome(fn):
        def call(name, args):
            try:
                return fn(name, args)
            except hx.ToolError as err:
                return ("error", str(err))

        return call

    sandbox = sim.Sandbox(world)
    mine = answers(outcome(lambda n, a: sandbox.tools[n](dict(a))))
    with hx.McpToolset(livestream.marketing_server(world)) as mcp:
        theirs = answers(outcome(lambda n, a: mcp.call(n, a)))
    assert mine == theirs
    assert any(isinstance(x, dict) and x.get("issued") for x in mine)
    assert any(isinstance(x, tuple) for x in mine)


def test_each_episode_starts_from_a_fresh_ledger(world):
    args = {"viewer_id": "v1001"}
    first = sim.Sandbox(world).tools["claim_follow_gift"](args)
    again = sim.Sandbox(world)
    assert again.tools["claim_follow_gift"](args) == first
    with pytest.raises(hx.ToolError, match="already claimed"):
        again.tools["claim_follow_gift"](args)


@pytest.mark.parametrize("kind", sim.FAULT_KINDS)
def test_fault_kinds(world, kind):
    box = sim.Sandbox(world, faults=sim.FaultConfig(**{kind: 1.0}), seed=0)
    call = lambda: box.tools["check_inventory"]({"product_id": "BT-001"})
    if kind == "timeout":
        with pytest.raises(hx.ToolTimeout):
            call()
    elif kind == "denied":
        with pytest.raises(hx.ToolDenied, match="permission denied"):
            call()
    else:
        value = call()
        assert box.injected[0].detail in sim.MALFORMED_KINDS
        assert value != world.inventory("BT-001")
    assert call() == world.inventory("BT-001")  # not persistent: the retry goes through
    assert [(f.tool, f.kind) for f in box.injected] == [("check_inventory", kind)]


def test_malformed_results_are_caught_by_the_after_tool_hook(world, base):
    """Each malformed form becomes an error result the policy sees, never a crash."""
    for seed in range(12):
        box = sim.Sandbox(world, faults=sim.FaultConfig(malformed=1.0), seed=seed)
        policy = hx.ScriptedPolicy(
            [
                hx.AssistantTurn(
                    tool_calls=(
                        hx.call("load_skill", name="product-qa"),
                        hx.call("check_inventory", product_id="BT-001"),
                    )
                ),
                hx.AssistantTurn(tool_calls=(hx.call("reply_public", text="Let me check again."),)),
            ]
        )
        traj = hx.run_agent(base, world.make_request("in stock?"), policy, box.tools)
        record = traj.tool_calls[1]
        assert record.error == "malformed" and record.result["error"]["type"] == "malformed_result"
        assert any(f.kind == "malformed_result" for f in traj.faults)


def test_persistent_faults_and_tool_filter(world):
    box = sim.Sandbox(
        world, faults=sim.FaultConfig(denied=1.0, persistent=True, tools=("check_inventory",))
    )
    for _ in range(3):
        with pytest.raises(hx.ToolDenied):
            box.tools["check_inventory"]({"product_id": "BT-001"})
    assert box.tools["get_price_promotion"]({"product_id": "BT-001"})["current_price"] == 149.0


def test_fault_draws_are_seeded(world):
    def draws(seed):
        box = sim.Sandbox(
            world, faults=sim.FaultConfig(timeout=0.3, malformed=0.3, denied=0.2), seed=seed
        )
        for pid in sorted(world.products)[:30]:
            with contextlib.suppress(hx.ToolError):
                box.tools["get_product_detail"]({"product_id": pid})
        return [(f.call, f.kind, f.detail) for f in box.injected]

    assert draws(1) == draws(1) and draws(1) != draws(2)
    kinds = {k for _, k, _ in draws(1)}
    assert kinds == set(sim.FAULT_KINDS)


def test_fault_config_is_checked():
    with pytest.raises(ValueError, match="sum to <= 1"):
        sim.FaultConfig(timeout=0.6, denied=0.6)
    with pytest.raises(ValueError, match=">= 0"):
        sim.FaultConfig(malformed=-0.1)
