# Over 400 lines: building the demo BPE and loading any Qwen tokenizer share the chat-token checks.
"""The demo tokenizer (a small byte-level BPE in Qwen3.5's layout) and `load_tokenizer`.

The demo policy needs a tokenizer that speaks the Qwen3.5 chat format but is small enough for a
tiny model on a CPU. This module trains one with the `tokenizers` library, reproducibly (the same
inputs give byte-identical files), on:

- every text file under the bundled world (`data/livestream/`: catalog, FAQs, Skills, tools),
- the chat format's own strings (the tool block and sample rendered conversations),
- a built-in bilingual (English and Chinese) corpus of live-commerce phrases, so a tokenizer can
  be built before, or without, the world.

The pipeline is Qwen3.5's: NFC normalisation, Qwen3.5's pre-tokenizer split, byte-level BPE
(no unknown tokens), byte-level decoding. The BPE vocabulary takes ids `0..n-1`, followed by
Qwen3.5's 33 added tokens in Qwen3.5's order (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, ...,
`<think>`, `</think>`, the audio tokens). `vocab_size` (default 8192) is the largest total
wanted, a multiple of 64; a corpus too small for it gives the largest multiple of 64 it supports
(the bundled world gives a few thousand), so `len(tokenizer)` is always a multiple of 64 and can
be the model's vocabulary size. `eos` is `<|im_end|>`, `pad` is `<|endoftext|>`, there is no BOS.
The output is a standard Hugging Face tokenizer directory (`tokenizer.json`,
`tokenizer_config.json` with the chat template) that `transformers.AutoTokenizer` loads offline,
plus `build_info.json` recording what it was built from.

    python -m data.tokenizer --out data/tokenizer [--vocab_size 8192] [--world data/livestream]
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import tokenizers
from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from hat_jax import chat_format, files

DEFAULT_DIR = pathlib.Path(__file__).with_name("tokenizer")
DEFAULT_WORLD = pathlib.Path(__file__).with_name("livestream")
_WORLD_SUFFIXES = (".md", ".json", ".jsonl", ".yaml", ".yml", ".txt")

# Qwen3.5's pre-tokenizer split: one digit per piece; letters keep their combining marks.
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5's added tokens in id order, with their `special` flag (special tokens are skipped
# when decoding with `skip_special_tokens`; the tool and think tags are not).
QWEN35_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
_ADDED_SPLIT = re.compile("|".join(re.escape(t) for t, _ in QWEN35_ADDED_TOKENS))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """What the demo tokenizer is built from.

    Attributes:
      vocab_size: the largest total vocabulary (BPE tokens plus the 33 added tokens) wanted; a
        multiple of 64. The corpus may support fewer (see `build_tokenizer`).
      world_dir: the bundled world whose text files are part of the corpus (may be missing).
      min_frequency: a pair must occur this often to be merged.
      model_max_length: the context length recorded in `tokenizer_config.json`.
    """

    vocab_size: int = 8192
    world_dir: str | os.PathLike = DEFAULT_WORLD
    min_frequency: int = 2
    model_max_length: int = 32768

    def __post_init__(self):
        if self.vocab_size % 64 or self.vocab_size < 320:
            raise ValueError(
                f"vocab_size={self.vocab_size}: must be a multiple of 64 and at least 320 "
                "(256 byte tokens + the 33 added tokens, rounded up)"
            )
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency={self.min_frequency}: must be >= 1")


def load_tokenizer(path: str | os.PathLike | None = None):
    """Loads the demo tokenizer, or a Qwen tokenizer from a local checkpoint directory.

    Never downloads. The directory must hold a Hugging Face tokenizer whose chat-format tokens
    (`<|im_start|>`, `<|im_end|>`, `<think>`, ...) are single tokens.

    Args:
      path: a local directory (e.g. a Qwen3.5 checkpoint); None for the bundled demo tokenizer.

    Returns:
      A `transformers` fast tokenizer.

    Raises:
      FileNotFoundError: the directory or its tokenizer files are missing.
      ValueError: the tokenizer does not have the Qwen chat-format tokens.
    """
    directory = pathlib.Path(path) if path is not None else DEFAULT_DIR
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer directory {str(directory)!r} does not exist")
    if not any((directory / f).is_file() for f in ("tokenizer.json", "vocab.json")):
        raise FileNotFoundError(
            f"{str(directory)!r} has no tokenizer.json (or vocab.json): not a tokenizer directory"
        )
    tokenizer = _tokenizer_class(directory).from_pretrained(str(directory), local_files_only=True)
    for token in chat_format.FORMAT_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"tokenizer in {str(directory)!r} splits the chat-format token {token!r} into "
                f"{len(ids)} tokens; it is not a Qwen-format tokenizer"
            )
    return tokenizer


def _tokenizer_class(directory: pathlib.Path) -> Any:
    """The class `transformers.AutoTokenizer` loads `directory` with, without importing
    `AutoTokenizer` where the directory decides it alone.

    A tokenizer-only directory (no model `config.json`, no custom code in `auto_map`) that names
    a class in `tokenizer_config.json` is loaded by `AutoTokenizer` as that class; the class is
    then taken from `transformers` directly, because `AutoTokenizer` imports the model-config
    machinery and with it torch (about 1.5 s of every launch process's start on a 2-core CPU,
    for a tokenizer). Anything else (a checkpoint's directory, where the model type can
    override the named class; `PythonBackend`, which `AutoTokenizer` replaces; a class
    transformers does not export) goes through `AutoTokenizer` itself."""
    import transformers

    config_file = directory / "tokenizer_config.json"
    if not (directory / "config.json").exists() and config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        name = config.get("tokenizer_class")
        if isinstance(name, str) and name != "PythonBackend" and "auto_map" not in config:
            for candidate in (name, name.removesuffix("Fast")):
                cls = getattr(transformers, candidate, None)
                if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase):
                    return cls
    return transformers.AutoTokenizer


def build_tokenizer(config: TokenizerConfig) -> tokenizers.Tokenizer:
    """Trains the BPE on the corpus and appends Qwen3.5's added tokens.

    The result has `config.vocab_size` tokens, or, when the corpus runs out of pairs to merge
    before that, the largest multiple of 64 it supports (BPE merges are learned greedily in a
    fixed order, so the smaller vocabulary is a prefix of the larger one).
    """
    added = len(QWEN35_ADDED_TOKENS)
    tokenizer = _train_bpe(config, config.vocab_size - added)
    supported = tokenizer.get_vocab_size() + added
    if supported < config.vocab_size:
        total = supported // 64 * 64
        if total < 320:
            raise ValueError(f"the corpus supports only {supported} tokens; it is nearly empty")
        tokenizer = _train_bpe(config, total - added)
    tokenizer.add_tokens(
        [AddedToken(t, special=s, normalized=False) for t, s in QWEN35_ADDED_TOKENS]
    )
    if tokenizer.get_vocab_size() % 64:
        raise AssertionError(f"vocabulary of {tokenizer.get_vocab_size()} is not a multiple of 64")
    return tokenizer


def _train_bpe(config: TokenizerConfig, bpe_size: int) -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=None, fuse_unk=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False)
    # Untrimmed offsets: `render_tokens` reads the loss mask off them.
    tokenizer.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=config.min_frequency,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Added-token strings are cut out of the corpus, so no merge learns their pieces.
    pieces = (p for text in corpus(config) for p in _ADDED_SPLIT.split(text) if p)
    tokenizer.train_from_iterator(pieces, trainer=trainer)
    return tokenizer


def save_tokenizer(
    tokenizer: tokenizers.Tokenizer, out: str | os.PathLike, config: TokenizerConfig
):
    """Writes the Hugging Face tokenizer directory, each file atomically."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / "tokenizer.json", tokenizer.to_str(pretty=True) + "\n")
    files.write_text(out / "tokenizer_config.json", _dump(_tokenizer_config(tokenizer, config)))
    info = {
        "requested_vocab_size": config.vocab_size,
        "min_frequency": config.min_frequency,
        "tokens": tokenizer.get_vocab_size(),
        "bpe_tokens": tokenizer.get_vocab_size() - len(QWEN35_ADDED_TOKENS),
        "world_files": [str(p.relative_to(config.world_dir)) for p in _world_files(config)],
        "corpus_sha256": _corpus_digest(config),
        "tokenizers_version": tokenizers.__version__,
    }
    files.write_text(out / "build_info.json", _dump(info))


def corpus(config: TokenizerConfig) -> Iterator[str]:
    """The training texts, in a fixed order: world files, format strings, built-in phrases."""
    for path in _world_files(config):
        yield path.read_text(encoding="utf-8", errors="replace")
    yield from _format_texts()
    yield from _phrase_corpus()


def _world_files(config: TokenizerConfig) -> list[pathlib.Path]:
    root = pathlib.Path(config.world_dir)
    if not root.is_dir():
        return []
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix in _WORLD_SUFFIXES]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _corpus_digest(config: TokenizerConfig) -> str:
    digest = hashlib.sha256()
    for text in corpus(config):
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def _tokenizer_config(tokenizer: tokenizers.Tokenizer, config: TokenizerConfig) -> dict[str, Any]:
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": s,
        }
        for t, s in QWEN35_ADDED_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": chat_format.CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": config.model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen3_5Tokenizer",
        "unk_token": None,
    }


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


_SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "product_search",
            "description": "Search the catalog by keyword. 按关键词搜索商品。",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "keywords"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "issue_coupon",
            "description": "Issue a coupon to a viewer. 给观众发放优惠券。",
            "parameters": {
                "type": "object",
                "properties": {
                    "viewer_id": {"type": "string"},
                    "amount": {"type": "number"},
                    "conditions": {"type": "object"},
                },
                "required": ["viewer_id", "amount"],
            },
        },
    },
]


def _format_texts() -> Iterator[str]:
    """Sample conversations rendered in the chat format, so its markup gets merges."""
    for i, (query, reply, args) in enumerate(_SAMPLE_TURNS):
        messages = [
            {"role": "system", "content": "You are the live-room host assistant. 你是直播间助理。"},
            {"role": "user", "content": query},
            {
                "role": "assistant",
                "reasoning_content": f"The viewer asks: {query} I should check the catalog.",
                "content": "",
                "tool_calls": [{"type": "function", "function": args}],
            },
            {
                "role": "tool",
                "content": json.dumps({"ok": True, "items": i + 1}, ensure_ascii=False),
            },
            {"role": "assistant", "reasoning_content": "Answer briefly.", "content": reply},
        ]
        yield chat_format.render(messages, _SAMPLE_TOOLS)


_SAMPLE_TURNS = [
    (
        "Do you have the red lipstick?",
        "Yes, the red lipstick is in stock.",
        {"name": "product_search", "arguments": {"query": "red lipstick", "limit": 3}},
    ),
    (
        "这款面膜还有货吗？",
        "有货的，宝宝放心拍！",
        {"name": "product_search", "arguments": {"query": "面膜", "limit": 5}},
    ),
    (
        "给我一张优惠券吧",
        "优惠券已经发给你啦，记得在今晚十二点前使用哦。",
        {
            "name": "issue_coupon",
            "arguments": {"viewer_id": "v_1024", "amount": 20, "conditions": {"min_spend": 199}},
        },
    ),
]

_EN_TEMPLATES = (
    "The {product} is {price} yuan today, down from {old} yuan.",
    "Only {n} {product} left in stock, grab yours now!",
    "Does the {product} come in {color}?",
    "Shipping for the {product} takes {n} days and is free over {price} yuan.",
    "You can return the {product} within {n} days if it is unopened.",
    "Use the coupon at checkout to save {n} yuan on the {product}.",
    "Welcome to the live room! Today we have {product} on sale.",
    "Thanks for the follow! Tap the cart to see the {product}.",
    "What size should I pick for the {product}? I am {n}0 kg.",
    "Where is my order? I bought the {product} {n} days ago.",
    "The flash sale on the {product} ends at {n} pm tonight.",
    "Is the {product} suitable for sensitive skin?",
    "How long does the battery of the {product} last?",
    "Can I get an invoice for the {product}?",
    "My {product} arrived damaged, what should I do?",
    "Sorry, the {color} {product} is sold out, but the restock arrives in {n} days.",
    "Please contact customer service about the refund for your {product}.",
    "Buy two {product} and get the third one half price.",
    "The {product} is made of {material} and weighs {n}00 grams.",
    "Is this {product} authentic? Do you have a warranty?",
    "I ordered the wrong color, can I exchange the {product} for {color}?",
    "The lottery starts in {n} minutes, follow the host to join.",
    "New followers get a {n} yuan gift on their first order of {product}.",
    "Please keep the chat friendly, and ask me anything about the {product}.",
)
_ZH_TEMPLATES = (
    "这款{product}今天直播间只要{price}元，原价{old}元。",
    "{product}只剩{n}件了，喜欢的宝宝抓紧下单！",
    "{product}有{color}的吗？",
    "{product}下单后{n}天内发货，满{price}元包邮。",
    "{product}未拆封的话{n}天内可以无理由退货。",
    "结算时使用优惠券，{product}可以再减{n}元。",
    "欢迎来到直播间！今天{product}限时特价。",
    "感谢关注！点击小黄车就能看到{product}。",
    "我体重{n}0公斤，{product}应该选什么尺码？",
    "我的订单到哪了？{product}已经买了{n}天了。",
    "{product}的秒杀活动今晚{n}点结束。",
    "{product}敏感肌可以用吗？",
    "{product}的电池能用多久？",
    "买{product}可以开发票吗？",
    "收到的{product}有破损，怎么处理？",
    "不好意思，{color}的{product}卖完了，{n}天后补货。",
    "关于{product}的退款，请联系在线客服处理。",
    "{product}买二送一，第三件半价。",
    "这款{product}是{material}材质，重量大约{n}00克。",
    "{product}是正品吗？有没有保修？",
    "我拍错颜色了，{product}能换成{color}吗？",
    "抽奖{n}分钟后开始，关注主播就能参与。",
    "新粉丝首单购买{product}立减{n}元。",
    "请文明发言，关于{product}的问题都可以问我哦。",
)
_EN_PRODUCTS = (
    "lipstick",
    "face mask",
    "sneakers",
    "down jacket",
    "rice cooker",
    "green tea",
    "sunscreen",
    "wireless earbuds",
    "phone case",
    "yoga mat",
    "coffee beans",
    "backpack",
)
_ZH_PRODUCTS = (
    "口红",
    "面膜",
    "运动鞋",
    "羽绒服",
    "电饭煲",
    "绿茶",
    "防晒霜",
    "无线耳机",
    "手机壳",
    "瑜伽垫",
    "咖啡豆",
    "双肩包",
)
_EN_COLORS = ("red", "black", "white", "pink", "navy blue", "olive green")
_ZH_COLORS = ("红色", "黑色", "白色", "粉色", "藏青色", "橄榄绿")
_EN_MATERIALS = ("cotton", "leather", "stainless steel", "silicone", "wool")
_ZH_MATERIALS = ("纯棉", "真皮", "不锈钢", "硅胶", "羊毛")


def _phrase_corpus() -> Iterator[str]:
    """Live-commerce phrases, expanded deterministically from templates and slot values."""
    sets = (
        (_EN_TEMPLATES, _EN_PRODUCTS, _EN_COLORS, _EN_MATERIALS),
        (_ZH_TEMPLATES, _ZH_PRODUCTS, _ZH_COLORS, _ZH_MATERIALS),
    )
    for templates, products, colors, materials in sets:
        for k, (template, product) in enumerate(itertools.product(templates, products)):
            price = 19 + 10 * (k % 17)
            yield template.format(
                product=product,
                price=price,
                old=price * 2,
                n=2 + k % 9,
                color=colors[k % len(colors)],
                material=materials[k % len(materials)],
            )


def main(argv: list[str]) -> None:
    del argv
    config = TokenizerConfig(
        vocab_size=_FLAGS.vocab_size, world_dir=_FLAGS.world, min_frequency=_FLAGS.min_frequency
    )
    tokenizer = build_tokenizer(config)
    save_tokenizer(tokenizer, _FLAGS.out, config)
    print(f"wrote {_FLAGS.out}: {tokenizer.get_vocab_size()} tokens")


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("out", str(DEFAULT_DIR), "output directory")
    flags.DEFINE_integer("vocab_size", 8192, "largest total vocabulary size (multiple of 64)")
    flags.DEFINE_string("world", str(DEFAULT_WORLD), "bundled world directory")
    flags.DEFINE_integer("min_frequency", 2, "minimum pair count for a merge")
    _FLAGS = flags.FLAGS
    app.run(main)
