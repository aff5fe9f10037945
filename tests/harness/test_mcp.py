"""Marketing tools over MCP through the real SDK: in-process, a stdio subprocess, streamable HTTP."""

import socket
import subprocess
import sys
import time
from typing import Any

import anyio
import pytest
from mcp.server.mcpserver import MCPServer

from hat_jax import harness as hx
from hat_jax import livestream
from tests.harness._helpers import turn

C = hx.call
MARKETING = {"issue_coupon", "get_lottery_status", "claim_follow_gift"}


def _exercise(toolset: hx.McpToolset, harness) -> None:
    assert {t.name for t in toolset.tools} == MARKETING
    toolbox = hx.bind_mcp_tools(harness, "marketing", toolset)
    assert set(toolbox) == MARKETING and hx.undeclared_tools(harness, toolset) == []
    coupon = toolbox["issue_coupon"]({"viewer_id": "v1011", "product_id": "EL-003"})
    assert coupon["campaign_id"] == "CP-LIVE618-30" and coupon["discount"] == 30.0
    lottery = toolbox["get_lottery_status"]({})
    assert lottery["lottery_id"] == "LT-0618-2100" and lottery["status"] == "open"


def test_in_process_discovery_and_calls(harness, world):
    with hx.McpToolset(livestream.marketing_server(world)) as toolset:
        _exercise(toolset, harness)


def test_coupon_rules_are_enforced_by_the_service(world):
    with hx.McpToolset(livestream.marketing_server(world)) as mcp:
        fan = mcp.call("issue_coupon", {"viewer_id": "v1001", "product_id": "BT-001"})
        assert fan["campaign_id"] == "CP-FAN-10"  # usable on a ¥149 item, for a follower
        nonfan = mcp.call("issue_coupon", {"viewer_id": "v1004", "product_id": "BT-001"})
        assert nonfan["campaign_id"] == "CP-LIVE618-30"
        with pytest.raises(hx.ToolError, match="already have .* followers only; .* fully claimed"):
            mcp.call("issue_coupon", {"viewer_id": "v1004", "product_id": "EL-007"})
        with pytest.raises(hx.ToolError, match="not logged in"):
            mcp.call("issue_coupon", {"viewer_id": "guest"})
        with pytest.raises(hx.ToolError, match="does not follow"):
            mcp.call("claim_follow_gift", {"viewer_id": "v1004"})
        assert mcp.call("claim_follow_gift", {"viewer_id": "v1001"})["granted"]
        with pytest.raises(hx.ToolError, match="already claimed"):
            mcp.call("claim_follow_gift", {"viewer_id": "v1001"})
        # The caller cannot choose an amount: unknown arguments are ignored by the service (and
        # rejected earlier by the Harness's schema check), the campaign sets the value.
        forced = mcp.call("issue_coupon", {"viewer_id": "v1001", "discount": 100})
        assert forced["discount"] == 30.0 and forced["campaign_id"] == "CP-LIVE618-30"


def test_marketing_through_the_agent_loop(state, world, tools, request_for):
    with hx.McpToolset(livestream.marketing_server(world)) as mcp:
        toolbox = tools.merged(hx.bind_mcp_tools(state, "marketing", mcp))
        traj = hx.run_agent(
            state,
            request_for("any coupon for the smart watch?", viewer="v1011"),
            livestream.RuleBasedPolicy(state, world),
            toolbox,
        )
    coupon = next(r for r in traj.tool_calls if r.canonical == "issue_coupon")
    assert (
        coupon.error is None
        and coupon.arguments == {"product_id": "EL-003"}
        and coupon.injected == ["viewer_id"]
    )
    assert "¥30 off coupon" in traj.spoken and not traj.final.fallback


def _slow_server() -> MCPServer:
    server = MCPServer("slow", log_level="WARNING")

    @server.tool(structured_output=True)
    async def get_lottery_status(lottery_id: str | None = None) -> dict[str, Any]:
        await anyio.sleep(2.0)
        return {"status": "late"}

    return server


def test_mcp_timeouts_reach_the_policy_as_errors(state, request_for):
    with hx.McpToolset(_slow_server(), timeout_s=0.2) as mcp:
        start = time.perf_counter()
        with pytest.raises(hx.ToolTimeout):
            mcp.call("get_lottery_status", {})
        assert time.perf_counter() - start < 1.5
        policy = hx.ScriptedPolicy(
            [
                turn(
                    C("load_skill", name="coupon-marketing"),
                    C("load_skill", name="general-reply"),
                    C("get_lottery_status"),
                ),
                turn(C("reply_public", text="The lottery details are on screen!")),
            ]
        )
        traj = hx.run_agent(
            state,
            request_for("lottery?"),
            policy,
            mcp.executors(["get_lottery_status"]),
            limits=hx.Limits(tool_timeout_s=0.3),
        )
    rec = traj.tool_calls[2]
    assert rec.error == "timeout" and [f.kind for f in traj.faults] == ["tool_timeout"]
    assert traj.spoken == "The lottery details are on screen!"


def test_discovery_reports_every_mismatch(harness):
    server = MCPServer("partial", log_level="WARNING")

    @server.tool()
    def issue_coupon(viewer_id: str, product_id: int, campaign: str) -> str:
        return "ok"

    @server.tool()
    def get_lottery_status(lottery_id: str | None = None) -> str:
        return "ok"

    @server.tool()
    def spin_wheel() -> str:
        return "ok"

    with hx.McpToolset(server) as mcp:
        with pytest.raises(hx.McpDiscoveryError) as err:
            hx.bind_mcp_tools(harness, "marketing", mcp)
        assert hx.undeclared_tools(harness, mcp) == ["spin_wheel"]
    text = "\n".join(err.value.problems)
    assert "claim_follow_gift: not offered by the server" in text
    assert (
        "issue_coupon: parameter 'product_id' has type ['string'] but the server takes ['integer']"
        in text
    )
    assert "issue_coupon: the server requires 'campaign'" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_stdio_subprocess(harness, world_dir):
    with hx.McpToolset(livestream.marketing_server_params(world_dir)) as toolset:
        _exercise(toolset, harness)


@pytest.mark.slow
def test_streamable_http(harness, world_dir):
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hat_jax.livestream.serve_marketing",
            "--world",
            str(world_dir),
            "--transport",
            "streamable-http",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        with hx.McpToolset(f"http://127.0.0.1:{port}/mcp") as toolset:
            _exercise(toolset, harness)
    finally:
        proc.terminate()
        proc.wait(10)
