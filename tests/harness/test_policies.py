"""Policies: the scripted double, the offline rule-based baseline, and the OpenAI-compatible HTTP
policy against a real local HTTP server."""

import http.server
import json
import threading
import time

import httpx
import pytest

from hat_jax import harness as hx
from hat_jax import livestream, llm_client
from tests.harness._helpers import turn

C = hx.call


def test_scripted_policy(state):
    policy = hx.ScriptedPolicy([turn(C("a")), lambda m, t: turn(content=f"{len(m)} messages")])
    assert policy.generate([], []).tool_calls[0].name == "a"
    assert policy.generate([{"role": "user", "content": "x"}], []).content == "1 messages"
    with pytest.raises(hx.PolicyError, match="asked for step 3"):
        policy.generate([], [])
    assert len(policy.calls) == 3
    assert isinstance(policy, hx.PolicyModel)


@pytest.fixture(scope="module")
def all_tools(world, harness):
    """Built-in tools plus the marketing tools of an in-process MCP server."""
    with hx.McpToolset(livestream.marketing_server(world)) as mcp:
        yield livestream.builtin_toolbox(world).merged(hx.bind_mcp_tools(harness, "marketing", mcp))


@pytest.mark.parametrize(
    "viewer, text, expect",
    [
        ("v1001", "how much is the serum?", ["¥149", "¥199", "23:59", "limit 2"]),
        ("v1002", "is size M of the wide leg trousers in stock?", ["Sold out: M", "S (55 left)"]),
        ("v1003", "how long does shipping take for the air fryer", ["72 hours", "JD Logistics"]),
        ("v1012", "does the power bank work on a plane?", ["100 Wh carry-on"]),
        ("v1001", "is the retinol night cream in stock", ["sold out", "2026-06-25"]),
        ("v1011", "can I return the smart watch?", ["7 days", "not activated"]),
        ("v1009", "this lipstick is terrible, it broke", ["so sorry", "7 days"]),
        ("v1001", "where is my order DD2606150034", ["private message"]),
        ("v1002", "where is my order DD2606150034", ["couldn't find that order"]),
        ("v1010", "when is the lottery?", ["21:00", "lucky 618"]),
        ("v1004", "are you a real person?", ["AI host"]),
        ("v1005", "hello!", ["welcome"]),
        ("v1007", "how do I buy the sunscreen?", ["¥119", "product card"]),
        ("v1001", "how much are the earbuds and the smart watch", ["AirBeat Pro", "¥449"]),
        ("v1011", "any coupon for the smart watch?", ["¥30 off coupon", "¥299"]),
        ("v1004", "can I get the follower gift?", ["follow first"]),
    ],
)
def test_rule_policy_answers_from_tool_results(
    state, world, all_tools, request_for, viewer, text, expect
):
    traj = hx.run_agent(
        state, request_for(text, viewer=viewer), livestream.RuleBasedPolicy(state, world), all_tools
    )
    assert not traj.final.fallback, traj.faults
    assert not [e for e in traj.hook_events if e.outcome in ("retry", "block")], traj.hook_events
    spoken = (traj.spoken or "") + " " + (traj.final.private or "")
    for fragment in expect:
        assert fragment.lower() in spoken.lower(), spoken
    assert traj.rounds <= 2


def test_rule_policy_private_details_stay_private(state, world, tools, request_for):
    traj = hx.run_agent(
        state,
        request_for("where is my order DD2606150034"),
        livestream.RuleBasedPolicy(state, world),
        tools,
    )
    assert "SF1460099812" in traj.final.private and "SF1460099812" not in traj.spoken


def test_rule_policy_obeys_a_tighter_length_limit(state, world, tools, request_for):
    import dataclasses

    tight = hx.HarnessState(
        harness=dataclasses.replace(
            state.harness, prompt=state.harness.prompt.with_constraint("reply_max_chars", 120)
        )
    )
    traj = hx.run_agent(
        tight,
        request_for("is size M of the wide leg trousers in stock and how fast is shipping?"),
        livestream.RuleBasedPolicy(tight, world),
        tools,
    )
    assert len(traj.spoken) <= 120 and not traj.final.fallback


class _Server:
    """A local chat-completions endpoint answering from a queue of scripted responses."""

    def __init__(self):
        self.requests, self.responses = [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                status, payload, delay = outer.responses.pop(0)
                time.sleep(delay)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def reply(self, message=None, status=200, delay=0.0, payload=None):
        self.responses.append(
            (status, payload if payload is not None else {"choices": [{"message": message}]}, delay)
        )


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.httpd.shutdown()


def _call(name, args, call_id="c1"):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def test_openai_policy_request_and_response(server, state):
    server.reply(
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "check price",
            "tool_calls": [_call("get_price_promotion", {"product_id": "BT-001"})],
        }
    )
    policy = hx.OpenAICompatPolicy(
        base_url=server.url, model="hat", api_key="sk-test", server_extensions=True
    )
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "old",
            "tool_calls": [C("load_skill", "c0", name="product-qa").to_message()],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "load_skill", "content": "ok"},
    ]
    out = policy.generate(
        messages,
        hx.tool_schemas(state),
        hx.SamplingParams(temperature=0.2, seed=7, enable_thinking=False),
    )
    assert out.tool_calls == (
        hx.ToolCall(id="c1", name="get_price_promotion", arguments={"product_id": "BT-001"}),
    )
    assert out.reasoning == "check price" and out.parse_errors == ()
    req = server.requests[0]
    assert (
        req["path"] == "/v1/chat/completions"
        and req["headers"]["Authorization"] == "Bearer sk-test"
    )
    body = req["body"]
    assert body["model"] == "hat" and body["temperature"] == 0.2 and body["seed"] == 7
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["separate_reasoning"] is True and body["tool_choice"] == "auto"
    assert len(body["tools"]) == 14
    sent = body["messages"][2]
    assert "reasoning_content" not in sent and json.loads(
        sent["tool_calls"][0]["function"]["arguments"]
    ) == {"name": "product-qa"}


def test_openai_policy_reports_bad_output_as_parse_errors(server):
    policy = hx.OpenAICompatPolicy(base_url=server.url, model="hat")
    server.reply(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("a", {}) | {"function": {"name": "a", "arguments": "{oops"}}],
        }
    )
    out = policy.generate([{"role": "user", "content": "u"}], [])
    assert out.tool_calls == () and "not valid JSON" in out.parse_errors[0]
    text_call = "<think>look it up</think>\n<tool_call>\n<function=check_inventory>\n<parameter=product_id>\nBT-001\n</parameter>\n</function>\n</tool_call>"
    server.reply({"role": "assistant", "content": text_call})
    out = policy.generate([{"role": "user", "content": "u"}], [])
    assert out.tool_calls[0].name == "check_inventory" and out.reasoning == "look it up"
    # Reasoning already split off by the server: the text before the call is content.
    no_think = "Let me check.\n" + text_call.split("\n", 1)[1]
    server.reply({"role": "assistant", "content": no_think, "reasoning_content": "r"})
    out = policy.generate([{"role": "user", "content": "u"}], [])
    assert out.tool_calls[0].name == "check_inventory"
    assert (out.content, out.reasoning) == ("Let me check.", "r")


def test_openai_policy_failures(server):
    policy = hx.OpenAICompatPolicy(
        base_url=server.url, model="hat", timeout_s=0.3, retry=llm_client.NO_RETRY
    )
    server.reply(status=500, payload={"error": "overloaded"})
    with pytest.raises(hx.PolicyError, match="HTTP 500"):
        policy.generate([{"role": "user", "content": "u"}], [])
    server.reply({"role": "assistant", "content": "late"}, delay=1.0)
    with pytest.raises(hx.PolicyError, match="timed out"):
        policy.generate([{"role": "user", "content": "u"}], [])
    server.reply(payload={"unexpected": True})
    with pytest.raises(hx.PolicyError, match="unexpected chat completion response"):
        policy.generate([{"role": "user", "content": "u"}], [])
    dead = hx.OpenAICompatPolicy(
        base_url="http://127.0.0.1:9/v1", model="hat", timeout_s=0.5, retry=llm_client.NO_RETRY
    )
    with pytest.raises(hx.PolicyError, match="failed"):
        dead.generate([{"role": "user", "content": "u"}], [])


def test_openai_policy_in_the_loop(server, state, tools, request_for):
    server.reply(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                _call("load_skill", {"name": "product-qa"}, "c1"),
                _call("get_price_promotion", {"product_id": "BT-001"}, "c2"),
            ],
        }
    )
    server.reply(
        {"role": "assistant", "content": "<think>price is 149</think>The serum is ¥149 tonight!"}
    )
    policy = hx.OpenAICompatPolicy(base_url=server.url, model="hat")
    traj = hx.run_agent(state, request_for("how much?"), policy, tools)
    assert (
        traj.spoken == "The serum is ¥149 tonight!"
        and traj.model_calls[1].output["reasoning"] == "price is 149"
    )
    second = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert json.loads(second[4]["content"])["current_price"] == 149.0


def _mock_policy(*responses, **kw):
    """A policy whose endpoint answers `responses` in order; the waits it would sleep."""
    queue, bodies, slept = list(responses), [], []

    def handler(request):
        bodies.append(json.loads(request.content))
        return queue.pop(0)

    retry = llm_client.RetryPolicy(jitter=0.0, sleep=slept.append)
    policy = hx.OpenAICompatPolicy(
        base_url="http://policy.test/v1",
        model="hat",
        retry=retry,
        transport=httpx.MockTransport(handler),
        **kw,
    )
    return policy, bodies, slept


def _ok(content="hi"):
    return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})


def test_openai_policy_sends_a_plain_request_unless_extensions_are_on():
    policy, bodies, _ = _mock_policy(_ok(), _ok())
    policy.generate([{"role": "user", "content": "u"}], [])
    assert "chat_template_kwargs" not in bodies[0] and "separate_reasoning" not in bodies[0]
    assert set(bodies[0]) == {"model", "messages", "temperature", "top_p", "max_tokens"}
    sglang, bodies, _ = _mock_policy(_ok(), server_extensions=True)
    sglang.generate(
        [{"role": "user", "content": "u"}], [], hx.SamplingParams(enable_thinking=False)
    )
    assert bodies[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert bodies[0]["separate_reasoning"] is True


def test_openai_policy_retries_a_rate_limit():
    limited = httpx.Response(429, headers={"Retry-After": "2"}, text="rate limited")
    policy, bodies, slept = _mock_policy(limited, _ok("after the wait"))
    assert policy.generate([{"role": "user", "content": "u"}], []).content == "after the wait"
    assert len(bodies) == 2 and slept == [2.0]
    assert policy.stats.to_dict() == {"calls": 1, "retries": 1, "failures": 0}


def test_openai_policy_raises_once_the_retries_are_spent():
    policy, bodies, slept = _mock_policy(*[httpx.Response(503, text="overloaded")] * 4)
    with pytest.raises(
        hx.PolicyError,
        match=r"http://policy.test/v1/chat/completions returned HTTP 503 after 4 attempts",
    ):
        policy.generate([{"role": "user", "content": "u"}], [])
    assert len(bodies) == 4 and slept == [0.5, 1.0, 2.0]
    assert policy.stats.to_dict() == {"calls": 1, "retries": 3, "failures": 1}
    bad, bodies, slept = _mock_policy(httpx.Response(400, text="unknown field"))
    with pytest.raises(hx.PolicyError, match="HTTP 400: unknown field"):
        bad.generate([{"role": "user", "content": "u"}], [])
    assert len(bodies) == 1 and slept == []
