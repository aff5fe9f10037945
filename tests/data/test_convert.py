"""Trajectory -> training conversation: the retry-history policy and per-prompt rows.

Every trajectory here comes from the real agent loop with a scripted policy, so the Hook
messages, rejected replies and error results are exactly what production records hold.
"""

import json

import pytest

import data
from hat_jax import chat_format
from hat_jax import harness as hx
from tests.data._helpers import record_of, run

A = hx.AssistantTurn
C = hx.call
REPLY = "@v1001 the serum is ¥149 in the live room right now."
LONG = "The serum is wonderful. " * 12  # breaks the reply-length Hook (200 characters)


def _roles(messages):
    return [m["role"] for m in messages]


def _error_types(messages):
    out = []
    for m in messages:
        if m["role"] == "tool":
            try:
                value = json.loads(m["content"])
            except ValueError:
                continue
            if isinstance(value, dict) and isinstance(value.get("error"), dict):
                out.append(value["error"]["type"])
    return out


def _call_ids(messages):
    return [c["id"] for m in messages for c in m.get("tool_calls") or ()]


@pytest.fixture(scope="module")
def retried(base_state, live_world, toolbox):
    """A rejected reply (no Skill loaded), a call with a bad argument next to a valid one, the
    fix, then the reply."""
    policy = hx.ScriptedPolicy(
        [
            A(reasoning="answer at once", tool_calls=(C("reply_public", "c1", text="149!"),)),
            A(
                reasoning="load the Skill, look up price and stock",
                tool_calls=(
                    C("load_skill", "c2", name="product-qa"),
                    C("get_price_promotion", "c3", product_id=12345),
                    C("check_inventory", "c4", product_id="BT-001"),
                ),
            ),
            A(
                reasoning="fix the id",
                tool_calls=(C("get_price_promotion", "c5", product_id="BT-001"),),
            ),
            A(reasoning="reply", tool_calls=(C("reply_public", "c6", text=REPLY),)),
        ]
    )
    traj = run(base_state, live_world, toolbox, policy)
    assert traj.final.public == REPLY and not traj.final.fallback
    assert {e.hook for e in traj.hook_events} >= {"require_reply_skill", "check_tool_arguments"}
    return traj


def test_clean_history_keeps_only_the_final_valid_behaviour(retried, base_state):
    tools = list(hx.tool_schemas(base_state))
    conv = data.trajectory_conversation(retried, tools, conversation_id="x")
    assert _call_ids(conv.messages) == ["c2", "c4", "c5", "c6"]
    assert _error_types(conv.messages) == []
    assert _roles(conv.messages) == ["system", "user"] + ["assistant", "tool", "tool"] + [
        "assistant",
        "tool",
        "assistant",
    ]
    results = {m["tool_call_id"]: m for m in conv.messages if m["role"] == "tool"}
    assert set(results) == {"c2", "c4", "c5"}
    assert all("weight" not in m for m in conv.messages)
    assert conv.messages[:2] == retried.messages[:2]


def test_full_history_keeps_everything_and_masks_failed_turns(retried, base_state):
    tools = list(hx.tool_schemas(base_state))
    conv = data.trajectory_conversation(retried, tools, keep_retries=True, conversation_id="x")
    assert [{k: v for k, v in m.items() if k != "weight"} for m in conv.messages] == (
        retried.messages
    )
    weights = [m.get("weight", 1) for m in conv.messages if m["role"] == "assistant"]
    assert weights == [0, 0, 1, 1]  # c1 rejected; c3 failed beside valid c2, c4
    assert sorted(_error_types(conv.messages)) == ["invalid_arguments", "rejected"]


def test_record_marks_its_retry_history(retried, rule_records, base_state):
    assert data.has_retries(retried.messages)
    full = record_of(retried, base_state, "x", keep_retries=True)
    clean = record_of(retried, base_state, "x")
    assert (full["retry_history"], clean["retry_history"]) == ("full", "final_only")
    assert all(r["retry_history"] == "none" for r in rule_records)
    for r in rule_records:  # without retries, the conversation is the trajectory's
        assert r["messages"] == r["trajectory"]["messages"]


def test_hook_message_after_a_trained_turn_splits_rows(base_state, live_world, toolbox):
    """A turn trained before a Hook message (a user turn) loses its reasoning in the full
    rendering, so it is trained in its own row, rendered as the policy saw it."""
    policy = hx.ScriptedPolicy(
        [
            A(
                reasoning="load and look up",
                tool_calls=(
                    C("load_skill", "d1", name="product-qa"),
                    C("get_price_promotion", "d2", product_id="BT-001"),
                ),
            ),
            A(reasoning="too long", content=LONG),
            A(reasoning="shorter", tool_calls=(C("reply_public", "d3", text=REPLY),)),
        ]
    )
    traj = run(base_state, live_world, toolbox, policy)
    assert traj.final.public == REPLY
    assert _roles(traj.messages).count("user") == 2  # the reply-length Hook spoke
    tools = list(hx.tool_schemas(base_state))
    clean = data.trajectory_conversation(traj, tools, conversation_id="c")
    assert _roles(clean.messages).count("user") == 1
    assert [m["content"] for m in clean.messages if m["role"] == "assistant"] == ["", ""]
    assert len(data.split_rows(clean)) == 1

    full = data.trajectory_conversation(traj, tools, keep_retries=True, conversation_id="f")
    rows = data.split_rows(full)
    assert [r.id for r in rows] == ["f#0", "f#1"]
    trained = [
        [i for i, m in enumerate(r.messages) if m["role"] == "assistant" and m.get("weight", 1)]
        for r in rows
    ]
    assert [len(t) for t in trained] == [1, 1]
    for row, turns in zip(rows, trained, strict=True):
        text = chat_format.render(row.messages, row.tools)
        for j in turns:
            prompt = chat_format.render(row.messages[:j], row.tools, add_generation_prompt=True)
            assert text.startswith(prompt)
    # the first turn is trained in row 0 and is context (weight 0) in row 1
    assert rows[1].messages[2]["weight"] == 0 and rows[0].messages[-1] == full.messages[2]


def test_malformed_turn_and_its_hook_message_are_removed(base_state, live_world, toolbox):
    policy = hx.ScriptedPolicy(
        [
            A(content="<tool_call>\n<function=load_skill", parse_errors=("unclosed tool call",)),
            A(reasoning="again", tool_calls=(C("load_skill", "e1", name="product-qa"),)),
            A(tool_calls=(C("get_price_promotion", "e2", product_id="BT-001"),)),
            A(tool_calls=(C("reply_public", "e3", text=REPLY),)),
        ]
    )
    traj = run(base_state, live_world, toolbox, policy)
    assert traj.final.public == REPLY
    conv = data.trajectory_conversation(traj, list(hx.tool_schemas(base_state)))
    assert _call_ids(conv.messages) == ["e1", "e2", "e3"]
    assert _roles(conv.messages).count("user") == 1
    assert not any("<tool_call>" in (m.get("content") or "") for m in conv.messages)


def test_environment_faults_and_their_recovery_are_kept(base_state, live_world, toolbox):
    """A timed-out tool is the environment's failure, not the model's: the retry that
    recovers from it is good behaviour and stays."""
    calls = {"n": 0}

    def flaky_inventory(args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise hx.ToolTimeout("inventory service timed out")
        return toolbox["check_inventory"](args)

    tools = hx.Toolbox({**dict(toolbox.items()), "check_inventory": flaky_inventory})
    policy = hx.ScriptedPolicy(
        [
            A(
                tool_calls=(
                    C("load_skill", "f1", name="product-qa"),
                    C("check_inventory", "f2", product_id="BT-001"),
                )
            ),
            A(
                reasoning="retry the timed-out call",
                tool_calls=(C("check_inventory", "f3", product_id="BT-001"),),
            ),
            A(tool_calls=(C("reply_public", "f4", text="@v1001 the serum is in stock."),)),
        ]
    )
    traj = run(base_state, live_world, tools, policy, text="is the serum in stock?")
    assert any(f.kind == "tool_timeout" for f in traj.faults)
    conv = data.trajectory_conversation(traj, list(hx.tool_schemas(base_state)))
    assert _call_ids(conv.messages) == ["f1", "f2", "f3", "f4"]
    assert _error_types(conv.messages) == ["timeout"]
    assert not data.has_retries(traj.messages)


def test_fallback_runs_have_no_valid_final_behaviour(base_state, live_world, toolbox):
    policy = hx.ScriptedPolicy([A(tool_calls=(C("reply_public", text="149!"),))], repeat_last=True)
    traj = run(base_state, live_world, toolbox, policy)
    assert traj.final.fallback
    with pytest.raises(data.ConversionError, match="fallback"):
        data.trajectory_conversation(traj, list(hx.tool_schemas(base_state)), conversation_id="z")
