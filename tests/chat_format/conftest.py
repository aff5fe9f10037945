"""Tokenizers for the chat-format tests: the demo tokenizer and differently built peers."""

import pytest
import tokenizers
import transformers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

from data.tokenizer import load_tokenizer
from hat_jax import chat_format

_CORPUS = [
    "The lipstick is 99 yuan today. Only 3 left in stock!",
    "这款口红今天只要九十九元，库存还有三件。",
    "<tool_call>\n<function=check_inventory>\n<parameter=product_id>\nlip-01\n</parameter>\n",
    '{"stock": 3, "ok": true} [1, 2.5] null',
] * 5


@pytest.fixture(scope="session")
def demo_tokenizer():
    return load_tokenizer()


def _gpt2_style(format_tokens_added: bool, **flags) -> tokenizers.Tokenizer:
    """A byte-level BPE with GPT-2's pre-tokenizer (not Qwen's), trained on a few lines."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    if format_tokens_added:
        tok.add_tokens(
            [AddedToken(t, normalized=False, **flags) for t in chat_format.FORMAT_TOKENS]
        )
    return tok


@pytest.fixture(scope="session")
def tokenizer_variants(demo_tokenizer):
    """name -> tokenizer: transformers and raw `tokenizers` objects, Qwen and non-Qwen splits."""
    gpt2 = _gpt2_style(format_tokens_added=True)
    bare = _gpt2_style(format_tokens_added=False)
    # Tokenizers on which encoding segments separately would drift: they take the full-text path.
    rstrip = _gpt2_style(format_tokens_added=True, rstrip=True, lstrip=True)
    longer = _gpt2_style(format_tokens_added=True)
    longer.add_tokens([AddedToken("<think>\n\n</think>", normalized=False)])
    return {
        "demo": demo_tokenizer,
        "demo_raw": demo_tokenizer.backend_tokenizer,
        "gpt2_style_raw": gpt2,
        "gpt2_style": transformers.PreTrainedTokenizerFast(tokenizer_object=gpt2),
        "format_tokens_not_added": transformers.PreTrainedTokenizerFast(tokenizer_object=bare),
        "format_tokens_strip_whitespace": rstrip,
        "longer_added_token": longer,
    }


@pytest.fixture(scope="session")
def demo_full_text():
    """The demo tokenizer with backend padding switched on: `render_tokens` then cannot use its
    segment cache and encodes the whole text through `tokenizer(...)` instead."""
    tokenizer = load_tokenizer()
    tokenizer.backend_tokenizer.enable_padding()
    return tokenizer
