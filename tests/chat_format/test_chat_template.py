"""The shipped Jinja template renders exactly what the Python renderer renders.

Checked through a real `transformers` tokenizer's `apply_chat_template` (the path SGLang and
vLLM take), over hand-picked conversations and hypothesis-generated ones.
"""

import json

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hat_jax.chat_format import CHAT_TEMPLATE, chat_template_path, render
from tests.chat_format.chat_format_cases import (
    CASE_IDS,
    CASES,
    TAGGY_TEXT,
    TOOLS_ST,
    conversation_st,
)

OPTIONS = [
    {},
    {"add_generation_prompt": True},
    {"add_generation_prompt": True, "enable_thinking": False},
    {"preserve_thinking": True},
    {"add_generation_prompt": True, "enable_thinking": True, "preserve_thinking": False},
]


def via_template(tokenizer, messages, tools, options):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **options)


def test_the_demo_tokenizer_ships_the_template(demo_tokenizer):
    assert demo_tokenizer.chat_template == CHAT_TEMPLATE
    assert chat_template_path().read_text(encoding="utf-8") == CHAT_TEMPLATE
    assert chat_template_path().name == "chat_template.jinja"


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
@pytest.mark.parametrize(("name", "messages", "tools"), CASES, ids=CASE_IDS)
def test_template_matches_renderer(demo_tokenizer, name, messages, tools, options):
    expected = render(messages, tools, **options)
    assert via_template(demo_tokenizer, messages, tools, options) == expected


def test_messages_are_not_modified(demo_tokenizer):
    for _, messages, tools in CASES:
        before = json.dumps([messages, tools], sort_keys=True)
        render(messages, tools)
        via_template(demo_tokenizer, messages, tools, {})
        assert json.dumps([messages, tools], sort_keys=True) == before


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.one_of(conversation_st(), conversation_st(TAGGY_TEXT)),
    tools=TOOLS_ST,
    options=st.sampled_from(OPTIONS),
)
def test_template_matches_renderer_on_generated_conversations(
    demo_tokenizer, messages, tools, options
):
    try:
        expected = render(messages, tools, **options)
    except ValueError:  # e.g. every user message is a wrapped tool response
        with pytest.raises(jinja2.TemplateError):
            via_template(demo_tokenizer, messages, tools, options)
        return
    assert via_template(demo_tokenizer, messages, tools, options) == expected


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "s"}],
        [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}],
        [{"role": "user", "content": "q"}, {"role": "critic", "content": "c"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        ],
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": 3}]}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": "f()"}],
    ],
)
def test_template_rejects_what_the_renderer_rejects(demo_tokenizer, messages):
    with pytest.raises(ValueError):
        render(messages)
    with pytest.raises(jinja2.TemplateError):
        via_template(demo_tokenizer, messages, None, {})
