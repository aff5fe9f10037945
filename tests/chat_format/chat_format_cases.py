"""Conversations and hypothesis strategies shared by the chat-format tests."""

import tokenizers
from hypothesis import strategies as st

STOCK_TOOL = {
    "type": "function",
    "function": {
        "name": "check_inventory",
        "description": "Stock of a product. 查询库存。",
        "parameters": {
            "type": "object",
            "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer"},
                "warehouses": {"type": "array", "items": {"type": "string"}},
                "filters": {"type": "object"},
                "express": {"type": "boolean"},
                "max_price": {"type": "number"},
                "note": {"type": ["string", "null"]},
            },
            "required": ["product_id"],
        },
    },
}
REPLY_TOOL = {
    "type": "function",
    "function": {
        "name": "public_reply",
        "description": "Say something to the whole live room.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}
TOOLS = [STOCK_TOOL, REPLY_TOOL]


def call(name, **arguments):
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def conversations():
    """(name, messages, tools) cases covering each rule of the format."""
    sys = {"role": "system", "content": "You are the host assistant of a live room. 你是直播助理。"}
    ask = {"role": "user", "content": "口红还有货吗? Is the red one in stock?"}
    stock_call = call(
        "check_inventory",
        product_id="lip-01",
        quantity=2,
        warehouses=["hz", "sh"],
        filters={"color": "红色", "sizes": [1, 2.5], "gift": None},
        express=True,
        max_price=99.9,
        note=None,
    )
    return [
        ("plain", [sys, ask, {"role": "assistant", "content": "Yes! 有货。"}], None),
        ("no_system", [ask, {"role": "assistant", "content": "Yes."}], None),
        ("empty_system", [{"role": "system", "content": "  "}, ask], None),
        ("tools_no_system", [ask], TOOLS),
        ("tools_empty_system", [{"role": "system", "content": ""}, ask], TOOLS),
        (
            "reasoning_and_call",
            [
                sys,
                ask,
                {
                    "role": "assistant",
                    "reasoning_content": "Check stock first.\n\nThen answer.",
                    "content": "Let me check.",
                    "tool_calls": [stock_call],
                },
            ],
            TOOLS,
        ),
        (
            "calls_in_a_row_no_content",
            [
                sys,
                ask,
                {
                    "role": "assistant",
                    "reasoning_content": "two calls",
                    "content": "",
                    "tool_calls": [
                        call("check_inventory", product_id="a"),
                        call("check_inventory", product_id="b", quantity=0),
                        call("public_reply", text="稍等\n马上查"),
                    ],
                },
            ],
            TOOLS,
        ),
        (
            "grouped_tool_responses",
            [
                sys,
                ask,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [call("check_inventory", product_id="a"), call("x")],
                },
                {"role": "tool", "tool_call_id": "call_check_inventory", "content": '{"stock": 3}'},
                {"role": "tool", "tool_call_id": "call_x", "name": "x", "content": "  error: x  "},
                {"role": "tool", "content": ""},
                {"role": "assistant", "reasoning_content": "3 left", "content": "还剩3件！"},
            ],
            TOOLS,
        ),
        (
            "multi_turn_drops_old_reasoning",
            [
                sys,
                {"role": "user", "content": "hi"},
                {"role": "assistant", "reasoning_content": "greet", "content": "Hello!"},
                {"role": "user", "content": "price?"},
                {
                    "role": "assistant",
                    "reasoning_content": "look up",
                    "content": "",
                    "tool_calls": [call("check_inventory", product_id="p")],
                },
                {"role": "tool", "content": "99"},
                {"role": "assistant", "reasoning_content": "answer", "content": "99 yuan."},
            ],
            TOOLS,
        ),
        (
            "reasoning_inside_content",
            [ask, {"role": "assistant", "content": "<think>\nhidden plan\n</think>\n\nvisible"}],
            None,
        ),
        (
            "old_reasoning_inside_content",
            [
                ask,
                {"role": "assistant", "content": "<think>plan</think>answer"},
                {"role": "user", "content": "again"},
            ],
            None,
        ),
        (
            "wrapped_tool_response_is_not_a_query",
            [
                ask,
                {"role": "assistant", "reasoning_content": "r1", "content": "a1"},
                {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
                {"role": "assistant", "reasoning_content": "r2", "content": "a2"},
            ],
            None,
        ),
        (
            "text_parts",
            [
                {"role": "system", "content": [{"type": "text", "text": "sys "}, {"text": "part"}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            None,
        ),
        (
            "unicode_and_padding",
            [
                {"role": "user", "content": "\n\t  宝宝们😀 ½ café e\u0301  \n"},
                {"role": "assistant", "reasoning_content": "  \n", "content": "  好的  "},
            ],
            None,
        ),
        (
            "empty_assistant",
            [ask, {"role": "assistant", "content": ""}],
            None,
        ),
        (
            "call_without_arguments",
            [
                ask,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "public_reply"}},
                        {"type": "function", "function": {"name": "public_reply", "arguments": {}}},
                        {"name": "public_reply", "arguments": {"text": "flat form"}},
                    ],
                },
            ],
            TOOLS,
        ),
        (
            "weight_and_alias",
            [
                ask,
                {"role": "assistant", "reasoning": "aliased", "content": "first try", "weight": 0},
                {"role": "user", "content": "<tool_response>hook: too long</tool_response>"},
                {"role": "assistant", "thinking": "shorter", "content": "ok"},
            ],
            None,
        ),
        ("ends_with_user", [sys, ask, {"role": "assistant", "content": "a"}, ask], TOOLS),
    ]


CASES = conversations()
CASE_IDS = [name for name, _, _ in CASES]

# --- hypothesis strategies ---------------------------------------------------------------

_ALPHABET = st.sampled_from(
    list("abcXYZ019 .,!?'\"{}[]<>/=_-\n\t") + list("口红面膜宝宝有货吗") + ["😀", "é", "\u0301"]
)
TEXT = st.text(_ALPHABET, max_size=40)
# Text that may also contain the format's own tags, to stress rendering and tokenization.
TAGGY_TEXT = st.lists(
    st.one_of(TEXT, st.sampled_from(["<think>", "</think>", "<tool_call>", "<|im_end|>", "\n\n"])),
    max_size=4,
).map("".join)
JSON_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    TEXT,
)
JSON_VALUE = st.recursive(
    JSON_SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)
_NAME = st.text(st.sampled_from(list("abcdefgh_0123")), min_size=1, max_size=12)


@st.composite
def tool_call_st(draw, text=TEXT):
    arguments = draw(st.dictionaries(_NAME, JSON_VALUE, max_size=4))
    return {"type": "function", "function": {"name": draw(_NAME), "arguments": arguments}}


@st.composite
def assistant_st(draw, text=TEXT):
    message = {"role": "assistant", "content": draw(text)}
    if draw(st.booleans()):
        message["reasoning_content"] = draw(text)
    if draw(st.booleans()):
        message["tool_calls"] = draw(st.lists(tool_call_st(), min_size=1, max_size=3))
    return message


@st.composite
def conversation_st(draw, text=TEXT):
    """A system prompt (maybe), then rounds of user query, assistant steps and tool results."""
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text)})
        for _ in range(draw(st.integers(0, 3))):
            message = draw(assistant_st(text))
            messages.append(message)
            for _ in message.get("tool_calls", []):
                messages.append({"role": "tool", "content": draw(text)})
    return messages


TOOLS_ST = st.one_of(st.none(), st.just([]), st.just(TOOLS))


def encode(tokenizer, text):
    """Reference encoding of the full text, the way a user would call the tokenizer."""
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return tokenizer.encode(text, add_special_tokens=False).ids
    return tokenizer(text, add_special_tokens=False)["input_ids"]
