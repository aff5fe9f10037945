"""The demo tokenizer: reproducible build, Qwen3.5 layout, loadable offline by transformers."""

import json
import pathlib
import subprocess
import sys

import pytest
import tokenizers
import transformers

from data.tokenizer import (
    DEFAULT_DIR,
    QWEN35_ADDED_TOKENS,
    TokenizerConfig,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
)
from hat_jax import chat_format

REPO = pathlib.Path(__file__).resolve().parents[2]
TEXTS = [
    "Hello world, the lipstick is 99 yuan! It's 50% off.",
    "这款口红今天只要九十九元，库存还有三件。宝宝们冲呀😀",
    "café e\u0301 naïve ½ 𝔘nicode  \n\n\t tabs   and   spaces\r\n",
    '{"product_id": "lip-01", "stock": [1, 2.5, null, true]}',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>",
    "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small stand-in world, so the build tests do not depend on the bundled one."""
    root = tmp_path_factory.mktemp("world")
    (root / "skills" / "qa").mkdir(parents=True)
    (root / "catalog.json").write_text(
        json.dumps([{"name": "Zephyrglow serum", "price": 129}] * 3), encoding="utf-8"
    )
    (root / "skills" / "qa" / "SKILL.md").write_text(
        "Zephyrglow Zephyrglow\n" * 5, encoding="utf-8"
    )
    (root / "ignored.bin").write_bytes(b"\x00Zephyrglow")
    return root


def test_build_is_byte_identical_across_runs(tmp_path, world):
    config = TokenizerConfig(vocab_size=1024, world_dir=world)
    for out in ("a", "b"):
        save_tokenizer(build_tokenizer(config), tmp_path / out, config)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["build_info.json", "tokenizer.json", "tokenizer_config.json"]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    info = json.loads((tmp_path / "a" / "build_info.json").read_text())
    assert info["world_files"] == ["catalog.json", "skills/qa/SKILL.md"]
    assert info["tokens"] == 1024


def test_the_world_is_in_the_corpus(world):
    with_world = build_tokenizer(TokenizerConfig(vocab_size=1024, world_dir=world))
    without = build_tokenizer(TokenizerConfig(vocab_size=1024, world_dir=world / "missing"))
    word = "Zephyrglow"
    assert len(with_world.encode(word).ids) == 1
    assert len(without.encode(word).ids) > 1


def test_vocabulary_is_capped_at_what_the_corpus_supports_in_multiples_of_64(world):
    small = build_tokenizer(TokenizerConfig(vocab_size=640, world_dir=world))
    assert small.get_vocab_size() == 640
    large = build_tokenizer(TokenizerConfig(vocab_size=64 * 1000, world_dir=world))
    assert large.get_vocab_size() % 64 == 0 and 640 < large.get_vocab_size() < 64 * 1000
    # The smaller vocabulary is a prefix of the larger one.
    large_vocab = large.get_vocab()
    n_bpe = 640 - len(QWEN35_ADDED_TOKENS)
    assert all(large_vocab[t] == i for t, i in small.get_vocab().items() if i < n_bpe)


@pytest.mark.parametrize("bad", [{"vocab_size": 1000}, {"vocab_size": 256}, {"min_frequency": 0}])
def test_config_is_validated(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TokenizerConfig(**bad)


def test_committed_tokenizer_layout():
    tokenizer = load_tokenizer()
    n = len(tokenizer)
    assert n % 64 == 0
    first = n - len(QWEN35_ADDED_TOKENS)
    for offset, (token, special) in enumerate(QWEN35_ADDED_TOKENS):
        assert tokenizer.convert_tokens_to_ids(token) == first + offset
        assert tokenizer.added_tokens_decoder[first + offset].special == special
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode(
        "hi", add_special_tokens=False
    )
    assert tokenizer.chat_template == chat_format.CHAT_TEMPLATE
    # Tool and think tags are added but not special: decoding keeps them.
    ids = tokenizer.encode("<think>x</think><tool_call>y</tool_call><|im_end|>")
    assert (
        tokenizer.decode(ids, skip_special_tokens=True)
        == "<think>x</think><tool_call>y</tool_call>"
    )


def test_committed_build_info_matches_the_tokenizer():
    info = json.loads((DEFAULT_DIR / "build_info.json").read_text())
    assert info["requested_vocab_size"] == TokenizerConfig().vocab_size
    assert info["tokens"] == len(load_tokenizer())


@pytest.mark.parametrize("text", TEXTS)
def test_transformers_encodes_as_the_tokenizer_file_does(text):
    loaded = load_tokenizer()
    raw = tokenizers.Tokenizer.from_file(str(DEFAULT_DIR / "tokenizer.json"))
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert loaded.decode(ids) == raw.decode(ids, skip_special_tokens=False)
    if text.isascii() or "\u0301" not in text:  # NFC folds e + U+0301 into é
        assert loaded.decode(ids) == text


def test_format_tokens_are_single_tokens():
    tokenizer = load_tokenizer()
    for token in chat_format.FORMAT_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    # A tokenizer without Qwen's chat tokens is refused, not silently used.
    plain = tokenizers.Tokenizer(tokenizers.models.BPE())
    plain.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    plain.train_from_iterator(["hello world"], trainer=trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=plain).save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="not a Qwen-format tokenizer"):
        load_tokenizer(tmp_path / "plain")


def test_load_tokenizer_picks_the_class_auto_tokenizer_picks_without_importing_torch(tmp_path):
    """The bundled directory names its class, which is taken from transformers directly: the
    same class and ids as `AutoTokenizer`, in a process that never imports torch (which
    `AutoTokenizer`'s model-config import pulls in)."""
    auto = transformers.AutoTokenizer.from_pretrained(str(DEFAULT_DIR), local_files_only=True)
    loaded = load_tokenizer()
    assert type(loaded) is type(auto)
    for text in TEXTS:
        assert loaded(text)["input_ids"] == auto(text)["input_ids"]
    code = (
        "import sys; from data.tokenizer import load_tokenizer; load_tokenizer(); "
        "print(sorted(m for m in ('torch', 'transformers.models.auto') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
    # A directory naming a class transformers does not export goes through AutoTokenizer,
    # which decides (today: its generic backend).
    custom = tmp_path / "custom"
    load_tokenizer().save_pretrained(custom)
    config = json.loads((custom / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "NoSuchTokenizer"
    (custom / "tokenizer_config.json").write_text(json.dumps(config))
    auto = transformers.AutoTokenizer.from_pretrained(str(custom), local_files_only=True)
    assert type(load_tokenizer(custom)) is type(auto) is not type(loaded)


def test_load_a_checkpoint_style_directory_offline(tmp_path, monkeypatch):
    """A Qwen3.5 checkpoint directory (config.json + tokenizer files), loaded with no network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint = tmp_path / "Qwen3.5-tiny"
    load_tokenizer().save_pretrained(checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))
    tokenizer = load_tokenizer(checkpoint)
    assert type(tokenizer).__name__ == "Qwen3_5Tokenizer"
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == chat_format.render(messages)


def test_command_line(tmp_path, world):
    out = tmp_path / "tok"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "data.tokenizer",
            f"--out={out}",
            "--vocab_size=768",
            f"--world={world}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "768 tokens" in result.stdout
    assert len(load_tokenizer(out)) == 768
