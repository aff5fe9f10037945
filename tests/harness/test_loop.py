"""The agent loop: step structure, limits (rounds, budget, per-tool timeout), recovery, routing,
multi-comment mode."""

import dataclasses
import json
import time

import pytest

from hat_jax import harness as hx
from hat_jax import livestream
from tests.harness._helpers import turn

C = hx.call
LOAD_QA = C("load_skill", name="product-qa")


def test_two_round_trajectory_record(state, tools, request_for):
    policy = hx.ScriptedPolicy(
        [
            turn(
                LOAD_QA, C("get_price_promotion", product_id="BT-001"), reasoning="need the price"
            ),
            turn(
                C("reply_public", text="The serum is ¥149 tonight, limit 2 per order."),
                reasoning="answer",
            ),
        ]
    )
    traj = hx.run_agent(state, request_for("how much?"), policy, tools)
    assert traj.spoken == "The serum is ¥149 tonight, limit 2 per order."
    assert traj.final.end == "reply" and not traj.final.fallback and traj.faults == []
    assert traj.rounds == 2 and traj.loaded_skills == ["product-qa"]
    first, second = traj.model_calls
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert second.messages[3]["content"].startswith("Skill product-qa loaded")
    assert first.output["reasoning"] == "need the price" and "get_price_promotion" in first.tools
    price = traj.tool_calls[1]
    assert (price.canonical, price.error, price.result["current_price"]) == (
        "get_price_promotion",
        None,
        149.0,
    )
    assert traj.harness == {"name": "livestream", "release": "v0", "version": state.harness.version}
    t = traj.timings
    assert (
        t["rounds"] == 2
        and abs(t["total_s"] - (t["model_s"] + t["tool_s"] + t["overhead_s"])) < 1e-6
    )
    assert policy.calls[1][0] == second.messages


def test_round_limit_from_limits_and_from_the_prompt(state, tools, request_for, harness):
    looping = hx.ScriptedPolicy([turn(C("search_faq", query="x"))], repeat_last=True)
    traj = hx.run_agent(state, request_for("hi"), looping, tools)
    assert traj.rounds == 4 and traj.faults[-1].kind == "max_rounds"
    assert (
        traj.spoken == harness.hooks.fallback.conservative_reply
        and traj.final.end == "fallback:max_rounds"
    )
    traj = hx.run_agent(state, request_for("hi"), looping, tools, limits=hx.Limits(max_rounds=2))
    assert traj.rounds == 2
    two = hx.HarnessState(
        harness=dataclasses.replace(harness, prompt=harness.prompt.with_constraint("max_rounds", 3))
    )
    assert hx.run_agent(two, request_for("hi"), looping, tools).rounds == 3


def test_slow_policy_hits_the_trajectory_budget(state, tools, request_for):
    slow = hx.ScriptedPolicy([turn(C("search_faq", query="x"))], delay_s=0.25, repeat_last=True)
    start = time.perf_counter()
    traj = hx.run_agent(state, request_for("hi"), slow, tools, limits=hx.Limits(budget_s=0.6))
    elapsed = time.perf_counter() - start
    assert elapsed < 0.6 + 0.4, elapsed
    assert traj.faults[-1].kind in ("policy_timeout", "budget")
    assert traj.model_calls[-1].error == "timeout" and traj.final.fallback


def test_slow_tool_times_out_and_the_policy_recovers(state, tools, request_for):
    slow = hx.Toolbox({**dict(tools), "check_inventory": lambda a: time.sleep(0.6) or {"total": 1}})
    policy = hx.ScriptedPolicy(
        [
            turn(
                LOAD_QA,
                C("check_inventory", product_id="BT-001"),
                C("get_price_promotion", product_id="BT-001"),
            ),
            lambda messages, _: turn(
                C(
                    "reply_public",
                    text="The serum is ¥149 tonight."
                    if '"timeout"' in messages[-2]["content"]
                    else "?",
                )
            ),
        ]
    )
    start = time.perf_counter()
    traj = hx.run_agent(
        state, request_for("stock and price?"), policy, slow, limits=hx.Limits(tool_timeout_s=0.1)
    )
    assert time.perf_counter() - start < 0.5
    inv = traj.tool_calls[1]
    assert (
        inv.error == "timeout"
        and inv.result["error"]["type"] == "timeout"
        and inv.elapsed_s == pytest.approx(0.1, abs=0.02)
    )
    assert traj.tool_calls[2].error is None  # the other call of the round was not held up
    assert [f.kind for f in traj.faults] == [
        "tool_timeout"
    ] and traj.spoken == "The serum is ¥149 tonight."


def test_tool_calls_of_a_round_run_in_parallel(state, request_for):
    def slow(result):
        return lambda a: time.sleep(0.2) or result

    toolbox = hx.Toolbox(
        {
            "search_faq": slow({"results": []}),
            "search_products": slow({"results": []}),
            "get_product_detail": slow({"specs": {}}),
        }
    )
    policy = hx.ScriptedPolicy(
        [
            turn(
                C("search_faq", query="a"),
                C("search_products", query="b"),
                C("get_product_detail", product_id="BT-001"),
            ),
            turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!")),
        ]
    )
    traj = hx.run_agent(state, request_for("hi"), policy, toolbox)
    assert traj.timings["tool_s"] < 0.4 and traj.timings["total_s"] < 0.55  # sequential: >= 0.6


def test_tool_failures_become_error_results(state, tools, request_for):
    def broken(args):
        raise RuntimeError("database on fire")

    def refused(args):
        raise hx.ToolDenied("campaign paused")

    toolbox = hx.Toolbox({**dict(tools), "search_products": broken, "search_faq": refused})
    policy = hx.ScriptedPolicy(
        [
            turn(
                C("search_products", query="x"),
                C("search_faq", query="y"),
                C("check_inventory", product_id="BT-001"),
            ),
            turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!")),
        ]
    )
    traj = hx.run_agent(state, request_for("hi"), policy, toolbox)
    crash, denied, gated = traj.tool_calls[:3]
    assert crash.error == "exception" and "database" not in crash.result["error"]["message"]
    assert denied.error == "denied" and denied.result["error"]["message"] == "campaign paused"
    assert gated.error == "not_allowed"
    assert [f.kind for f in traj.faults] == [
        "tool_exception"
    ] and "database on fire" in traj.faults[0].detail
    assert traj.spoken == "Hi!"


def test_missing_executor(state, request_for):
    policy = hx.ScriptedPolicy(
        [
            turn(C("search_faq", query="x")),
            turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!")),
        ]
    )
    traj = hx.run_agent(state, request_for("hi"), policy, hx.Toolbox({}))
    assert (
        traj.tool_calls[0].error == "no_executor"
        and traj.faults[0].kind == "no_executor"
        and traj.spoken == "Hi!"
    )


def test_policy_errors_retry_once_then_fall_back(state, tools, request_for):
    class Flaky:
        def __init__(self, failures):
            self.failures = failures

        def generate(self, messages, tools_, sampling):
            if self.failures:
                self.failures -= 1
                raise hx.PolicyError("HTTP 503")
            return turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!"))

    once = hx.run_agent(state, request_for("hi"), Flaky(1), tools)
    assert (
        once.spoken == "Hi!"
        and [f.kind for f in once.faults] == ["policy_error"]
        and once.rounds == 2
    )
    twice = hx.run_agent(state, request_for("hi"), Flaky(2), tools)
    assert twice.final.fallback and [f.kind for f in twice.faults] == [
        "policy_error",
        "policy_error",
        "policy_error",
    ]
    wrong = hx.run_agent(
        state,
        request_for("hi"),
        hx.ScriptedPolicy([lambda m, t: "not a turn"], repeat_last=True),
        tools,
    )
    assert wrong.final.fallback and "not AssistantTurn" in wrong.faults[0].detail


def test_public_private_and_no_reply_routing(state, tools, request_for):
    steps = [
        turn(
            C("load_skill", name="after-sales"),
            C("get_order_status", order_id="DD2606150034"),
            C("reply_private", text="Order DD2606150034 is shipped, tracking SF1460099812."),
            C("reply_public", text="I've sent you a private message about your order."),
        )
    ]
    traj = hx.run_agent(
        state, request_for("where is my order DD2606150034"), hx.ScriptedPolicy(steps), tools
    )
    assert traj.final.public == "I've sent you a private message about your order."
    assert traj.final.private.startswith("Order DD2606150034") and traj.final.private_to == "v1001"
    assert (
        traj.tool_calls[1].injected == ["viewer_id"]
        and traj.tool_calls[1].result["status"] == "shipped"
    )
    silent = hx.run_agent(
        state,
        request_for("spam spam"),
        hx.ScriptedPolicy([turn(C("no_reply", reason="spam"))]),
        tools,
    )
    assert (
        silent.final.suppressed
        and silent.final.end == "no_reply"
        and silent.final.no_reply_reason == "spam"
    )


def test_a_rejected_reply_in_a_pair_holds_back_both(state, tools, request_for):
    steps = [
        turn(
            C("load_skill", name="chit-chat"),
            C("reply_public", text="I'm a real person!"),
            C("reply_private", text="hi"),
        ),
        turn(C("reply_public", text="Hi!")),
    ]
    traj = hx.run_agent(state, request_for("hi"), hx.ScriptedPolicy(steps), tools)
    results = [m for m in traj.model_calls[1].messages if m["role"] == "tool"][-2:]
    assert '"rejected"' in results[0]["content"] and '"not_delivered"' in results[1]["content"]
    assert traj.final.public == "Hi!" and traj.final.private is None


def test_too_many_calls_in_a_round(state, tools, request_for):
    calls = [C("search_faq", query=str(i)) for i in range(10)]
    policy = hx.ScriptedPolicy(
        [turn(*calls), turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!"))]
    )
    traj = hx.run_agent(
        state, request_for("hi"), policy, tools, limits=hx.Limits(max_calls_per_round=3)
    )
    tool_msgs = [m for m in traj.model_calls[1].messages if m["role"] == "tool"]
    assert len(tool_msgs) == 10 and sum("too_many_calls" in m["content"] for m in tool_msgs) == 7


def test_limits_are_validated():
    with pytest.raises(ValueError, match="budget_s"):
        hx.Limits(budget_s=0)


def test_group_comments():
    c = [
        hx.Comment(text="how much is the serum", viewer_id="a", ts=0.0),
        hx.Comment(text="and the serum size?", viewer_id="b", ts=5.0),
        hx.Comment(text="hello!", viewer_id="c", ts=6.0),
        hx.Comment(text="is it in stock", viewer_id="a", ts=20.0),
        hx.Comment(text="serum price?", viewer_id="d", ts=200.0),
    ]
    topics = lambda text: ["BT-001"] if "serum" in text else []  # noqa: E731
    groups = hx.group_comments(c, topics=topics, window_s=30.0)
    assert [[x.viewer_id for x in g] for g in groups] == [["a", "b", "a"], ["c"], ["d"]]
    assert [len(g) for g in hx.group_comments(c * 3, topics=topics, max_group=2)][:2] == [2, 2]


def test_multi_comment_mode_answers_related_comments_together(state, world, tools):
    comments = [
        hx.Comment(text="how much is the serum?", viewer_id="v1001", handle="lily", ts=0.0),
        hx.Comment(text="serum price please", viewer_id="v1002", handle="annie", ts=3.0),
    ]
    (group,) = hx.group_comments(comments, topics=world.match_products)
    req = world.make_request(group, mode="multi")
    traj = hx.run_agent(state, req, livestream.RuleBasedPolicy(state, world), tools)
    assert "[1] @lily: how much is the serum?" in traj.messages[1]["content"]
    assert "[2] @annie: serum price please" in traj.messages[1]["content"]
    assert traj.spoken.startswith("@lily, @annie,") and "¥149" in traj.spoken
    assert "multi-intent" in traj.loaded_skills
    assert sum(r.canonical == "get_price_promotion" for r in traj.tool_calls) == 1


def test_inline_calls_still_obey_their_deadlines(state, tools, request_for):
    """Inline executors and policies run on the loop's thread; an overrun is a timeout and its
    late result is discarded."""
    toolbox = hx.Toolbox(
        {"search_faq": lambda a: time.sleep(0.15) or {"results": ["late"]}}, inline=["search_faq"]
    )
    policy = hx.ScriptedPolicy(
        [
            turn(C("search_faq", query="x")),
            turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!")),
        ]
    )
    traj = hx.run_agent(
        state, request_for("hi"), policy, toolbox, limits=hx.Limits(tool_timeout_s=0.05)
    )
    assert traj.tool_calls[0].error == "timeout" and "late" not in json.dumps(
        traj.tool_calls[0].result
    )
    assert traj.spoken == "Hi!"

    class SlowInline:
        inline = True

        def generate(self, messages, tools_, sampling):
            time.sleep(0.3)
            return turn(C("load_skill", name="chit-chat"), C("reply_public", text="Hi!"))

    late = hx.run_agent(
        state, request_for("hi"), SlowInline(), tools, limits=hx.Limits(budget_s=0.1)
    )
    assert late.faults[-1].kind == "policy_timeout" and late.spoken != "Hi!"
    with pytest.raises(ValueError, match="inline names without an executor"):
        hx.Toolbox({}, inline=["x"])
    assert livestream.builtin_toolbox.__doc__ and all(tools.is_inline(n) for n in tools)
