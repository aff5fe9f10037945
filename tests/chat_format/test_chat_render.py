"""The Python renderer against hand-written Qwen3.5 text, rule by rule."""

import json

import pytest

from hat_jax.chat_format import generation_prompt, render, render_completion
from tests.chat_format.chat_format_cases import TOOLS, call

TOOL_BLOCK = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    '{"type": "function", "function": {"name": "public_reply", "description": "Say it.", '
    '"parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}\n'
    "</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)
REPLY = {
    "type": "function",
    "function": {
        "name": "public_reply",
        "description": "Say it.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


def test_full_agent_turn_matches_hand_written_text():
    messages = [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": "还有货吗？"},
        {
            "role": "assistant",
            "reasoning_content": "check",
            "content": "Checking.",
            "tool_calls": [
                call("stock", id="a1", n=2, tags=["x", "红"], opts={"k": None}, ok=False, p=1.5),
                call("public_reply", text="wait\nplease"),
            ],
        },
        {"role": "tool", "content": '{"stock": 3}'},
        {"role": "tool", "content": " done "},
        {"role": "assistant", "reasoning_content": "", "content": "3 left!"},
    ]
    expected = (
        TOOL_BLOCK + "\n\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n还有货吗？<|im_end|>\n"
        "<|im_start|>assistant\n<think>\ncheck\n</think>\n\nChecking.\n\n"
        "<tool_call>\n<function=stock>\n"
        "<parameter=id>\na1\n</parameter>\n"
        "<parameter=n>\n2\n</parameter>\n"
        '<parameter=tags>\n["x", "红"]\n</parameter>\n'
        '<parameter=opts>\n{"k": null}\n</parameter>\n'
        "<parameter=ok>\nfalse\n</parameter>\n"
        "<parameter=p>\n1.5\n</parameter>\n"
        "</function>\n</tool_call>\n"
        "<tool_call>\n<function=public_reply>\n<parameter=text>\nwait\nplease\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"stock": 3}\n</tool_response>\n'
        "<tool_response>\ndone\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n3 left!<|im_end|>\n"
    )
    assert render(messages, [REPLY]) == expected


def test_reasoning_is_kept_only_after_the_last_user_query():
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "reasoning_content": "r1", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "reasoning_content": "r2", "content": "", "tool_calls": [call("f")]},
        {"role": "tool", "content": "x"},
        {"role": "assistant", "reasoning_content": "r3", "content": "a3"},
    ]
    text = render(messages)
    assert "<|im_start|>assistant\na1<|im_end|>" in text
    assert "r1" not in text
    assert "<think>\nr2\n</think>\n\n<tool_call>" in text
    assert "<think>\nr3\n</think>\n\na3<|im_end|>" in text
    kept = render(messages, preserve_thinking=True)
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>" in kept


def test_a_wrapped_tool_response_from_the_user_is_not_a_query():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "reasoning_content": "r1", "content": "a1"},
        {"role": "user", "content": " <tool_response>x</tool_response> "},
        {"role": "assistant", "reasoning_content": "r2", "content": "a2"},
    ]
    text = render(messages)
    assert "<think>\nr1\n</think>" in text and "<think>\nr2\n</think>" in text


def test_reasoning_written_inside_content_is_split_out():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\nanswer"},
    ]
    assert render(messages).endswith(
        "<|im_start|>assistant\n<think>\nplan\n</think>\n\nanswer<|im_end|>\n"
    )


def test_generation_prompts():
    messages = [{"role": "user", "content": "hi"}]
    assert render(messages, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    no_think = render(messages, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert generation_prompt(False) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # Thinking mode affects only the generation prompt, never the history.
    history = [*messages, {"role": "assistant", "reasoning_content": "r", "content": "a"}]
    assert render(history, enable_thinking=False) == render(history)


def test_system_prompt_without_tools_and_empty_tools_list():
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    expected = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert render(messages) == expected
    assert render(messages, []) == expected
    assert render(messages, [REPLY]) == TOOL_BLOCK + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_render_completion_is_the_turn_after_the_generation_prompt():
    message = {
        "role": "assistant",
        "reasoning_content": "r",
        "content": "c",
        "tool_calls": [call("f", a=1)],
    }
    completion = render_completion(message)
    assert completion == (
        "r\n</think>\n\nc\n\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>"
    )
    conversation = [{"role": "user", "content": "q"}]
    prompt = render(conversation, add_generation_prompt=True)
    assert prompt + completion + "\n" == render([*conversation, message])
    plain = render_completion({"role": "assistant", "content": "c"}, enable_thinking=False)
    assert plain == "c<|im_end|>"


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "empty"),
        ("hello", "list of message dicts"),
        ([{"role": "system", "content": "s"}], "no user query"),
        ([{"role": "user", "content": "<tool_response>x</tool_response>"}], "no user query"),
        ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}], "only first"),
        ([{"role": "user", "content": "q"}, {"role": "developer", "content": "d"}], "role"),
        ([{"content": "q"}], r"messages\[0\].role"),
        ([{"role": "user", "content": 5}], r"messages\[0\].content"),
        ([{"role": "user", "content": [{"type": "image", "image": "x"}]}], "text parts"),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                },
            ],
            r"messages\[1\].tool_calls\[0\].function.arguments",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": {"a": 1}}],
            "tool_calls",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"x": 1}]}],
            "name",
        ),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "weight": 0.5}], "weight"),
    ],
)
def test_malformed_conversations_are_rejected_with_the_field_named(messages, match):
    with pytest.raises(ValueError, match=match):
        render(messages)


def test_malformed_tools_are_rejected():
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        render([{"role": "user", "content": "q"}], ["not a schema"])
    with pytest.raises(ValueError, match="tools"):
        render([{"role": "user", "content": "q"}], {"type": "function"})


def test_render_completion_rejects_reasoning_when_thinking_is_off():
    with pytest.raises(ValueError, match="enable_thinking=False"):
        render_completion({"role": "assistant", "reasoning_content": "r"}, enable_thinking=False)
    with pytest.raises(ValueError, match="assistant"):
        render_completion({"role": "user", "content": "x"})


def test_tools_are_rendered_one_json_per_line_in_order():
    text = render([{"role": "user", "content": "q"}], TOOLS)
    lines = text.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    assert [json.loads(line) for line in lines] == TOOLS
    assert "查询库存" in text  # not \u-escaped
