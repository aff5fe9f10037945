"""`render_tokens`: exact token ids of the rendered text, and a loss mask on the assistant's tokens."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hat_jax.chat_format import RenderedTokens, render, render_completion, render_tokens
from tests.chat_format.chat_format_cases import (
    CASE_IDS,
    CASES,
    TAGGY_TEXT,
    TOOLS,
    TOOLS_ST,
    call,
    conversation_st,
    encode,
)

VARIANTS = [
    "demo",
    "demo_raw",
    "gpt2_style",
    "gpt2_style_raw",
    "format_tokens_not_added",
    "format_tokens_strip_whitespace",
    "longer_added_token",
]
# Tokenizers whose format tokens are plain added tokens, as in every Qwen tokenizer.
PLAIN_VARIANTS = VARIANTS[:5]


def trainable_text(tokenizer, rendered):
    """The text of the masked-in tokens, via character offsets of an independent encoding."""
    offsets = _offsets(tokenizer, rendered.text)
    return "".join(rendered.text[s:e] for (s, e), m in zip(offsets, rendered.loss_mask) if m)


def _offsets(tokenizer, text):
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    return backend.encode(text, add_special_tokens=False).offsets


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("name", "messages", "tools"), CASES, ids=CASE_IDS)
def test_ids_equal_tokenizing_the_full_text(tokenizer_variants, variant, name, messages, tools):
    tokenizer = tokenizer_variants[variant]
    for options in ({}, {"add_generation_prompt": True, "enable_thinking": False}):
        rendered = render_tokens(messages, tokenizer, tools, **options)
        assert rendered.text == render(messages, tools, **options)
        assert rendered.ids == encode(tokenizer, rendered.text)
        assert len(rendered.loss_mask) == len(rendered.ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.one_of(conversation_st(), conversation_st(TAGGY_TEXT)),
    tools=TOOLS_ST,
    variant=st.sampled_from(VARIANTS),
    thinking=st.booleans(),
)
def test_ids_equal_tokenizing_the_full_text_on_generated_conversations(
    tokenizer_variants, messages, tools, variant, thinking
):
    tokenizer = tokenizer_variants[variant]
    try:
        rendered = render_tokens(messages, tokenizer, tools, enable_thinking=thinking)
    except ValueError:
        return  # no user query: rejected, as the template rejects it
    assert rendered.ids == encode(tokenizer, rendered.text)
    assert set(rendered.loss_mask) <= {0, 1}
    produced = trainable_text(tokenizer, rendered)
    turns = sum(m["role"] == "assistant" for m in messages)
    if "<|im_end|>" not in repr(messages):  # else message text adds its own
        assert produced.count("<|im_end|>") == turns


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.one_of(conversation_st(), conversation_st(TAGGY_TEXT)),
    tools=TOOLS_ST,
    thinking=st.booleans(),
)
def test_segment_cache_gives_the_full_text_encoding_and_mask(
    demo_tokenizer, demo_full_text, messages, tools, thinking
):
    try:
        cached = render_tokens(messages, demo_tokenizer, tools, enable_thinking=thinking)
    except ValueError:
        return
    again = render_tokens(messages, demo_tokenizer, tools, enable_thinking=thinking)
    full = render_tokens(messages, demo_full_text, tools, enable_thinking=thinking)
    assert cached == again == full


def mask_runs(tokenizer, rendered):
    """The rendered text cut into runs of equal mask value: [(text, mask), ...]."""
    runs = []
    for (start, end), m in zip(_offsets(tokenizer, rendered.text), rendered.loss_mask):
        if runs and runs[-1][1] == m:
            runs[-1] = (runs[-1][0] + rendered.text[start:end], m)
        else:
            runs.append((rendered.text[start:end], m))
    return runs


def test_mask_by_hand_on_a_small_conversation(demo_tokenizer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "reasoning_content": "R", "content": "A", "tool_calls": [call("f")]},
        {"role": "tool", "content": "T"},
        {"role": "assistant", "reasoning_content": "R2", "content": "B"},
    ]
    rendered = render_tokens(messages, demo_tokenizer)
    assert mask_runs(demo_tokenizer, rendered) == [
        (
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n",
            0,
        ),
        (
            "R\n</think>\n\nA\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>",
            1,
        ),
        (
            "\n<|im_start|>user\n<tool_response>\nT\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n",
            0,
        ),
        ("R2\n</think>\n\nB<|im_end|>", 1),
        ("\n", 0),
    ]
    # Without thinking, the empty think block is part of the prompt header.
    no_think = render_tokens(
        messages[:2] + [{"role": "assistant", "content": "A"}],
        demo_tokenizer,
        enable_thinking=False,
    )
    runs = mask_runs(demo_tokenizer, no_think)
    assert runs[0][0].endswith("Q<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert runs[1:] == [("A<|im_end|>", 1), ("\n", 0)]
    # Before the last user query the turn has no think block; only its header is masked out.
    history = render_tokens(messages[:3] + [{"role": "user", "content": "Q2"}], demo_tokenizer)
    assert ("A\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>", 1) in (
        mask_runs(demo_tokenizer, history)
    )


@pytest.mark.parametrize("variant", PLAIN_VARIANTS)
@pytest.mark.parametrize("thinking", [True, False])
def test_each_turn_trains_on_exactly_what_a_sampler_would_produce(
    tokenizer_variants, variant, thinking
):
    """Prompt ids (with generation prompt) + completion ids == the full conversation's ids;
    the completion is all 1, the generation prompt all 0, earlier turns keep their mask."""
    tokenizer = tokenizer_variants[variant]
    user = {"role": "user", "content": "库存多少？How many?"}
    steps = [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [call("check_inventory", product_id="p1", quantity=2)],
        },
        {"role": "tool", "content": '{"stock": 7}'},
        {"role": "assistant", "content": "", "tool_calls": [call("public_reply", text="7 left")]},
        {"role": "tool", "content": "sent"},
        {"role": "assistant", "content": "还剩7件。"},
    ]
    if thinking:
        for step in steps[::2]:
            step["reasoning_content"] = "reasoning about the stock"
    conversation = [{"role": "system", "content": "Host."}, user]
    for step in steps:
        if step["role"] == "assistant":
            prompt = render_tokens(
                conversation, tokenizer, TOOLS, add_generation_prompt=True, enable_thinking=thinking
            )
            full = render_tokens([*conversation, step], tokenizer, TOOLS, enable_thinking=thinking)
            completion = encode(tokenizer, render_completion(step, enable_thinking=thinking))
            n = len(prompt.ids)
            assert full.ids[:n] == prompt.ids
            assert full.ids[n:-1] == completion  # the last token is the newline after <|im_end|>
            assert full.loss_mask == prompt.loss_mask + [1] * len(completion) + [0]
            history = render_tokens(conversation, tokenizer, TOOLS, enable_thinking=thinking)
            assert prompt.ids[: len(history.ids)] == history.ids
            assert prompt.loss_mask == history.loss_mask + [0] * (n - len(history.ids))
        conversation.append(step)


def test_empty_reasoning_newline_token_counts_as_the_models(demo_tokenizer):
    """`<think>\\n` (prompt) + `\\n</think>` (model): Qwen's split keeps `\\n\\n` together."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    rendered = render_tokens(messages, demo_tokenizer)
    pieces = demo_tokenizer.convert_ids_to_tokens(rendered.ids)
    k = pieces.index("<think>")
    assert pieces[k : k + 3] == ["<think>", "ĊĊ", "</think>"]
    assert rendered.loss_mask[k : k + 3] == [0, 1, 1]


def test_weight_zero_masks_a_turn_out(demo_tokenizer):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "bad reply", "weight": 0},
        {"role": "user", "content": "<tool_response>\nhook: too long\n</tool_response>"},
        {"role": "assistant", "content": "ok"},
    ]
    rendered = render_tokens(messages, demo_tokenizer)
    text = trainable_text(demo_tokenizer, rendered)
    assert "bad" not in text and text.endswith("ok<|im_end|>")
    assert render(messages) == rendered.text


def test_tool_results_hooks_and_prompts_are_never_trained_on(demo_tokenizer):
    marker = "ZZZ"
    messages = [
        {"role": "system", "content": f"system {marker}"},
        {"role": "user", "content": f"user {marker}"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("check_inventory", product_id="p")],
        },
        {"role": "tool", "content": f"tool {marker}"},
        {"role": "user", "content": f"<tool_response>\nhook {marker}\n</tool_response>"},
        {"role": "assistant", "content": "done"},
    ]
    rendered = render_tokens(messages, demo_tokenizer, TOOLS, add_generation_prompt=True)
    text = trainable_text(demo_tokenizer, rendered)
    assert marker not in text and "<tool_response>" not in text and "check_inventory" in text
    assert rendered.loss_mask[-4:] == [0, 0, 0, 0]  # the generation prompt


def test_rendered_tokens_validates_lengths():
    with pytest.raises(ValueError, match="differ"):
        RenderedTokens(ids=[1, 2], loss_mask=[1])


def test_a_tokenizer_without_offsets_is_refused():
    class Slow:
        is_fast = False

    with pytest.raises(TypeError, match="fast"):
        render_tokens([{"role": "user", "content": "q"}], Slow())


def test_padding_enabled_on_the_backend_does_not_leak_in(tokenizer_variants):
    tokenizer = tokenizer_variants["gpt2_style"]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    plain = render_tokens(messages, tokenizer)
    tokenizer.backend_tokenizer.enable_padding(length=512, pad_id=0)
    try:
        padded = render_tokens(messages, tokenizer)
    finally:
        tokenizer.backend_tokenizer.no_padding()
    assert padded == plain
