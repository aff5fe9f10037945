"""`parse`: well-formed turns round-trip; malformed output is recovered or reported, never raised."""

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hat_jax.chat_format import ParsedToolCall, ParsedTurn, parse, render_completion
from tests.chat_format.chat_format_cases import JSON_VALUE, TOOLS, call

TAGS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_response>",
)


def strip_ids(message):
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["tool_calls"] = [
        {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or {}}
        for c in message.get("tool_calls", [])
    ]
    return out


def as_message(parsed):
    return strip_ids(parsed.to_message())


def clean(parsed):
    return not parsed.errors and not parsed.warnings


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "Hello! 你好"},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": "line 1\n\nline 2"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                call(
                    "check_inventory",
                    product_id="lip-01",
                    quantity=2,
                    warehouses=["hz", "sh"],
                    filters={"color": "红", "n": [1, 2.5, None, True]},
                    express=False,
                    max_price=99.5,
                    note=None,
                )
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                call("public_reply", text="two\nlines, {not json"),
                call("public_reply", text="  padded  "),
                call("check_inventory", product_id="007", note="n/a"),
            ],
        },
    ],
)
def test_well_formed_turns_round_trip_with_schemas(message, thinking):
    if thinking:
        message = {**message, "reasoning_content": "First check stock.\n\nThen reply."}
    parsed = parse(
        render_completion(message, enable_thinking=thinking), TOOLS, enable_thinking=thinking
    )
    assert clean(parsed), (parsed.errors, parsed.warnings)
    assert as_message(parsed) == strip_ids(message)


_SAFE = st.text(
    st.sampled_from(list("abcXYZ 019.,!?'\"{}[]<>/=_-\n\t:") + list("口红宝宝😀")), max_size=30
)


def no_tags(text):
    return not any(tag in text for tag in TAGS)


_TYPED = {
    "string": _SAFE,
    "integer": st.integers(-(10**15), 10**15),
    "number": st.floats(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
    "null": st.none(),
    "object": st.dictionaries(_SAFE, JSON_VALUE, max_size=3),
    "array": st.lists(JSON_VALUE, max_size=3),
}
_PARAM = st.text(st.sampled_from(list("abcdefg_123")), min_size=1, max_size=8)


@st.composite
def tool_and_call(draw):
    kinds = draw(st.dictionaries(_PARAM, st.sampled_from(sorted(_TYPED)), max_size=5))
    name = draw(_PARAM)
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": k} for p, k in kinds.items()},
            },
        },
    }
    arguments = {p: draw(_TYPED[k]) for p, k in kinds.items()}
    return schema, call(name, **arguments)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reasoning=_SAFE,
    content=_SAFE,
    calls=st.lists(tool_and_call(), max_size=3),
    thinking=st.booleans(),
)
def test_generated_turns_round_trip(reasoning, content, calls, thinking):
    texts = [reasoning, content] + [repr(c) for _, c in calls]
    assume(all(no_tags(t) for t in texts))
    message = {"role": "assistant", "content": content.strip()}
    if thinking and reasoning.strip():
        message["reasoning_content"] = reasoning.strip()
    if calls:
        message["tool_calls"] = [c for _, c in calls]
    tools = [schema for schema, _ in calls]
    assume(len({s["function"]["name"] for s in tools}) == len(tools))
    text = render_completion(message, enable_thinking=thinking)
    parsed = parse(text, tools, enable_thinking=thinking)
    assert clean(parsed), (text, parsed)
    assert _same(as_message(parsed), strip_ids(message))


def _same(a, b):
    """Equality that treats floats by value (so -0.0 == 0.0) and nested containers alike."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_without_schemas_scalars_stay_strings_and_json_containers_decode():
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("f", n=3, ok=True, ids=[1, 2], opts={"a": None}, s="[not json")],
    }
    parsed = parse(render_completion(message))
    assert parsed.tool_calls == [
        ParsedToolCall(
            "f", {"n": "3", "ok": "true", "ids": [1, 2], "opts": {"a": None}, "s": "[not json"}
        )
    ]
    assert parsed.warnings == ["parameter f.s looks like JSON but does not parse; kept as text"]
    assert not parsed.errors


# --- fuzzing -------------------------------------------------------------------------------

_SOUP = st.lists(
    st.one_of(
        st.sampled_from(TAGS + ("<parameter=x>", "<function=f>", ">", "\n", "{", "}", "[1,", "5")),
        st.text(max_size=8),
    ),
    max_size=25,
).map("".join)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_SOUP, tools=st.sampled_from([None, TOOLS]), thinking=st.booleans())
def test_parse_never_raises_on_tag_soup(text, tools, thinking):
    parsed = parse(text, tools, enable_thinking=thinking)
    assert isinstance(parsed, ParsedTurn)
    assert all(isinstance(e, str) for e in parsed.errors + parsed.warnings)
    assert not any("internal parser error" in e for e in parsed.errors), parsed.errors
    for c in parsed.tool_calls:
        assert isinstance(c.name, str) and c.name and isinstance(c.arguments, dict)
    parsed.to_message()


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_parse_never_raises_on_arbitrary_text(text):
    parsed = parse(text, TOOLS)
    assert not any("internal parser error" in e for e in parsed.errors)


@pytest.mark.parametrize("value", [None, 5, b"bytes", ["x"]])
def test_non_text_input_is_an_error_not_an_exception(value):
    parsed = parse(value)
    assert parsed.errors and not parsed.tool_calls


# --- malformed output, case by case -------------------------------------------------------

CALL = "<tool_call>\n<function=check_inventory>\n<parameter=product_id>\np1\n</parameter>\n"
CLOSED = CALL + "</function>\n</tool_call>"


def test_unclosed_think_without_calls_is_unfinished_reasoning():
    parsed = parse("still thinking about the price")
    assert parsed.reasoning == "still thinking about the price" and parsed.content == ""
    assert parsed.errors == [
        "unclosed <think>: the output ended inside its reasoning (no </think>)"
    ]
    # With thinking off there was no think block to close: it is the reply.
    assert parse("just a reply", enable_thinking=False) == ParsedTurn("", "just a reply", [], [])


def test_unclosed_think_ends_at_the_first_tool_call():
    parsed = parse("I need stock\n" + CLOSED, TOOLS)
    assert parsed.reasoning == "I need stock"
    assert parsed.tool_calls == [ParsedToolCall("check_inventory", {"product_id": "p1"})]
    assert not parsed.errors and "missing </think>" in parsed.warnings[0]


def test_tool_calls_inside_think_are_extracted():
    text = "plan: " + CLOSED + " then answer\n</think>\n\nOne moment."
    parsed = parse(text, TOOLS)
    assert parsed.reasoning == "plan:\n\nthen answer"
    assert parsed.content == "One moment."
    assert [c.name for c in parsed.tool_calls] == ["check_inventory"]
    assert parsed.warnings == ["1 tool call(s) written inside <think>; accepted"]


def test_explicit_think_open_and_stop_tokens():
    parsed = parse("<think>\nr\n</think>\n\nhi<|im_end|>")
    assert (parsed.reasoning, parsed.content) == ("r", "hi") and clean(parsed)
    parsed = parse("r</think>hi<|im_end|>\n<|im_start|>user\nmore")
    assert parsed.content == "hi" and parsed.warnings == [
        "text after the end-of-turn token ignored"
    ]
    assert parse("r</think>hi<|endoftext|>").content == "hi"


@pytest.mark.parametrize(
    ("text", "warning"),
    [
        (CALL + "</function>", "missing </tool_call>"),
        (CALL + "</tool_call>", "missing </function>"),
        (CALL + "<|im_end|>", "missing </function> and </tool_call>"),
        (
            "<tool_call>\n<function=check_inventory>\n<parameter=product_id>\np1\n"
            "<parameter=quantity>\n2\n</parameter>\n</function>\n</tool_call>",
            "missing </parameter>",
        ),
    ],
)
def test_unclosed_xml_is_closed_when_the_call_is_complete(text, warning):
    parsed = parse("r</think>" + text, TOOLS)
    assert len(parsed.tool_calls) == 1 and parsed.tool_calls[0].arguments["product_id"] == "p1"
    assert not parsed.errors
    assert any(warning in w for w in parsed.warnings), parsed.warnings


def test_a_call_cut_off_by_the_token_limit_is_dropped():
    parsed = parse("r</think>ok\n<tool_call>\n<function=f>\n<parameter=text>\nhal", TOOLS)
    assert parsed.tool_calls == [] and parsed.content == "ok"
    assert parsed.errors == ["call to 'f' cut off inside parameter 'text' (output ended); dropped"]
    # Every parameter closed, but no </function>: more parameters may have been coming.
    parsed = parse("r</think>" + CALL, TOOLS)
    assert parsed.tool_calls == []
    assert parsed.errors == [
        "call to 'check_inventory' cut off before </function> (output ended); dropped"
    ]
    # The same text ended by the model itself is a complete (if sloppy) call.
    assert len(parse("r</think>" + CALL + "<|im_end|>", TOOLS).tool_calls) == 1
    # So is an open call inside think, which </think> ends.
    in_think = parse(CALL + "</think>\n\nOne moment.", TOOLS)
    assert [c.name for c in in_think.tool_calls] == ["check_inventory"] and not in_think.errors


def test_two_unclosed_calls_in_a_row_are_both_recovered():
    text = "r</think><tool_call>\n<function=a>\n</function>\n<tool_call>\n<function=b>\n</function>"
    parsed = parse(text)
    assert [c.name for c in parsed.tool_calls] == ["a", "b"] and not parsed.errors


def test_bare_function_and_json_call_forms_are_accepted():
    bare = parse(
        "r</think><function=public_reply>\n<parameter=text>\nhi\n</parameter>\n</function>"
    )
    assert bare.tool_calls == [ParsedToolCall("public_reply", {"text": "hi"})]
    assert bare.warnings == ["<function=...> without an enclosing <tool_call>; accepted"]
    qwen3 = parse('r</think><tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert qwen3.tool_calls == [ParsedToolCall("f", {"x": 1})] and not qwen3.errors
    as_string = parse('r</think><tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>')
    assert as_string.tool_calls == [ParsedToolCall("f", {"x": 2})]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("<tool_call>\n{broken json\n</tool_call>", "neither XML nor valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "lacks a name"),
        ("<tool_call>\nno function here\n</tool_call>", "without <function=NAME>"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "empty function name"),
    ],
)
def test_unusable_calls_are_dropped_with_an_error(body, error):
    parsed = parse("r</think>" + body)
    assert parsed.tool_calls == []
    assert any(error in e for e in parsed.errors), parsed.errors


def test_values_are_coerced_against_the_schema():
    text = (
        "r</think><tool_call>\n<function=check_inventory>\n"
        "<parameter=product_id>\n12\n</parameter>\n"
        "<parameter=quantity>\n 3.0 \n</parameter>\n"
        "<parameter=warehouses>\n['hz', 'sh']\n</parameter>\n"
        '<parameter=filters>\n{"a": 1}\n</parameter>\n'
        "<parameter=express>\nTrue\n</parameter>\n"
        "<parameter=max_price>\n1e3\n</parameter>\n"
        "<parameter=note>\nnull\n</parameter>\n"
        "<parameter=extra>\n[1]\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    parsed = parse(text, TOOLS)
    assert parsed.tool_calls[0].arguments == {
        "product_id": "12",  # declared string: kept as written
        "quantity": 3,
        "warehouses": ["hz", "sh"],  # a Python literal, repaired
        "filters": {"a": 1},
        "express": True,
        "max_price": 1000.0,
        "note": None,
        "extra": [1],  # not in the schema: JSON-looking, decoded
    }
    assert clean(parsed)


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ({"type": ["integer", "string"]}, "7", 7),
        ({"type": ["integer", "string"]}, "seven", "seven"),
        ({"anyOf": [{"type": "number"}, {"type": "null"}]}, "null", None),
        ({"anyOf": [{"type": "number"}, {"type": "null"}]}, "2.5", 2.5),
        ({"enum": [1, 2, 3]}, "2", 2),
        ({"enum": ["a", "b"]}, "a", "a"),
        ({"const": True}, "true", True),
        ({"type": "integer"}, "-12", -12),
        ({"$ref": "#/defs/x"}, '{"k": 1}', {"k": 1}),
    ],
)
def test_union_enum_and_untyped_schemas(schema, value, expected):
    tools = [{"function": {"name": "f", "parameters": {"properties": {"p": schema}}}}]
    text = f"r</think><tool_call>\n<function=f>\n<parameter=p>\n{value}\n</parameter>\n</function>\n</tool_call>"
    parsed = parse(text, tools)
    assert parsed.tool_calls[0].arguments == {"p": expected} and not parsed.errors


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("integer", "three"),
        ("integer", "2.5"),
        ("number", "fast"),
        ("boolean", "yes"),
        ("object", "[1]"),
        ("array", "{oops"),
        ("null", "nothing"),
    ],
)
def test_values_that_fit_no_declared_type_are_errors(kind, value):
    tools = [{"function": {"name": "f", "parameters": {"properties": {"p": {"type": kind}}}}}]
    text = f"r</think><tool_call>\n<function=f>\n<parameter=p>\n{value}\n</parameter>\n</function>\n</tool_call>"
    parsed = parse(text, tools)
    assert parsed.tool_calls == [ParsedToolCall("f", {"p": value})]  # kept as text for the hook
    assert parsed.errors == [f"parameter f.p: expected {kind}, got {value!r}"]


def test_text_after_calls_and_stray_tags_are_reported():
    parsed = parse("r</think>hi\n" + CLOSED + "\nbye", TOOLS)
    assert parsed.content == "hi\n\nbye"
    assert "text after a tool call (the format allows text only before)" in parsed.warnings
    stray = parse("r</think>hello</think> world</tool_call>")
    assert stray.content == "hello world"
    assert "stray format tags removed from the content" in stray.warnings


def test_duplicate_and_empty_parameters():
    text = (
        "r</think><tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
        "<parameter=a>\n2\n</parameter>\n<parameter= >\nx\n</parameter>\n</function>\n</tool_call>"
    )
    parsed = parse(text)
    assert parsed.tool_calls == [ParsedToolCall("f", {"a": "2"})]
    assert "parameter 'a' of 'f' given twice; last kept" in parsed.warnings
    assert parsed.errors == ["parameter with an empty name in the call to 'f'; ignored"]


def test_to_message_assigns_call_ids():
    parsed = ParsedTurn("r", "c", [ParsedToolCall("f", {"x": 1}), ParsedToolCall("g", {})], [])
    message = parsed.to_message(["call_abc"])
    assert message == {
        "role": "assistant",
        "content": "c",
        "reasoning_content": "r",
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "f", "arguments": {"x": 1}},
            },
            {"id": "call_1", "type": "function", "function": {"name": "g", "arguments": {}}},
        ],
    }
