"""Records to token rows: exact loss masks, the truncation policy, bad records reported."""

import json

import numpy as np
import pytest

import data
from hat_jax import chat_format
from hat_jax import harness as hx
from tests.data._helpers import record_of, run

A = hx.AssistantTurn
C = hx.call


def _runs(mask):
    """[start, end) of each run of 1s."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2], edges[1::2], strict=True))


def _masked_text(tokenizer, ids, mask) -> str:
    return "".join(
        tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=False) for a, b in _runs(mask)
    )


def _trained_completions(messages) -> str:
    return "".join(
        chat_format.render_completion(m)
        for m in messages
        if m["role"] == "assistant" and m.get("weight", 1)
    )


def _prepare(record, tokenizer, **options):
    options.setdefault("seq_len", 16384)
    return data.prepare(
        json.dumps(record),
        record_id="t",
        tokenizer=tokenizer,
        options=data.RenderOptions(**options),
    )


def test_loss_mask_is_exactly_the_assistant_tokens(rule_records, tokenizer):
    for record in rule_records:
        p = _prepare(record, tokenizer)
        assert p.status == "ok" and len(p.rows) == 1
        ids, mask = p.rows[0]["input_ids"], p.rows[0]["loss_mask"]
        assert ids.dtype == mask.dtype == np.int32
        assert _masked_text(tokenizer, ids, mask) == _trained_completions(record["messages"])
        unmasked = tokenizer.decode(ids[mask == 0].tolist(), skip_special_tokens=False)
        for m in record["messages"]:
            if m["role"] in ("system", "user", "tool"):
                assert m["content"].strip()[:200] in unmasked


def test_failed_turns_and_hook_messages_are_not_trained(base_state, live_world, toolbox, tokenizer):
    # Every turn has reasoning: an empty think block shares its "\n\n" token with the prompt
    # (see hat_jax.chat_format), which the chat-format tests cover.
    hook_text = "is shorter than this"
    policy = hx.ScriptedPolicy(
        [
            A(reasoning="answer at once", tool_calls=(C("reply_public", "c1", text="149!"),)),
            A(reasoning="load", tool_calls=(C("load_skill", "c2", name="product-qa"),)),
            A(reasoning="long", content="The serum is wonderful. " * 12),
            A(reasoning="short", tool_calls=(C("reply_public", "c3", text="@v1001 ¥149 today."),)),
        ]
    )
    traj = run(base_state, live_world, toolbox, policy)
    record = record_of(traj, base_state, "full", keep_retries=True)
    p = _prepare(record, tokenizer)
    assert p.status == "ok" and len(p.rows) == 2  # the Hook message after turn c2 splits it
    masked = "".join(_masked_text(tokenizer, r["input_ids"], r["loss_mask"]) for r in p.rows)
    assert masked == _trained_completions(record["messages"])
    assert "149!" not in masked and "wonderful" not in masked and hook_text not in masked
    assert "Skill" not in masked and "rejected" not in masked  # tool results and Hook text


@pytest.mark.parametrize("policy", ["drop", "right"])
def test_truncation_policy(rule_records, tokenizer, policy):
    full = _prepare(rule_records[0], tokenizer).rows[0]
    first = int(np.argmax(full["loss_mask"]))
    seq_len = first + 8
    p = _prepare(rule_records[0], tokenizer, seq_len=seq_len, truncation=policy)
    if policy == "drop":
        assert (p.status, p.rows, p.too_long, p.truncated) == ("empty", [], 1, 0)
    else:
        assert p.status == "ok" and (p.too_long, p.truncated) == (0, 1)
        np.testing.assert_array_equal(p.rows[0]["input_ids"], full["input_ids"][:seq_len])
        np.testing.assert_array_equal(p.rows[0]["loss_mask"], full["loss_mask"][:seq_len])
    # a cut that leaves no trained token drops the row under either policy
    p = _prepare(rule_records[0], tokenizer, seq_len=first, truncation=policy)
    assert (p.status, p.too_long) == ("empty", 1)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"{not json", "JSONDecodeError"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"id": "q", "tools": []}', "neither 'messages' nor 'trajectory'"),
        (
            b'{"messages": [{"role": "robot", "content": "x"}, {"role": "user", "content": "a"},'
            b' {"role": "assistant", "content": "b"}]}',
            "robot",
        ),
        (b'{"id": "q", "messages": []}', "non-empty list"),
        (b'{"id": "q", "trajectory": {"schema_version": 99}}', "schema_version"),
        (b'{"id": "q", "messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
        (b"\xff\xfe", "UnicodeDecodeError"),
    ],
)
def test_bad_records_are_reported_not_raised(tokenizer, raw, reason):
    p = data.prepare(
        raw, record_id="loc", tokenizer=tokenizer, options=data.RenderOptions(seq_len=64)
    )
    assert p.status == "bad" and p.rows == []
    assert reason in p.reason


def test_options_are_checked():
    with pytest.raises(ValueError, match="truncation"):
        data.RenderOptions(seq_len=64, truncation="left")
    with pytest.raises(ValueError, match="seq_len"):
        data.RenderOptions(seq_len=1)
    with pytest.raises(ValueError, match="hsa_probability"):
        data.RenderOptions(seq_len=64, hsa_probability=1.5)
