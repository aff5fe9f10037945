"""`serve.digest`: a checkpoint's digest changes with any weight byte, config or tokenizer file,
is the same however often it is computed, is stored by the HF export and read back while the
files are untouched, a stale manifest is named, and an Orbax checkpoint hashes what loads."""

import json
import os
import time

import pytest
from flax import nnx

import models
from data.tokenizer import DEFAULT_DIR
from hat_jax.checkpoint import save_params
from serve import convert
from serve import digest as dg


def _hf_dir(path, weights=b"\x00" * 64):
    """A directory that reads as an HF export: weights, config, tokenizer files."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "layers": 2}))
    (path / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    (path / "tokenizer_config.json").write_text("{}")
    return path


def _age(path, seconds=100):
    """Sets every file's mtime `seconds` in the past (as files written before their manifest)."""
    past = time.time() - seconds
    for p in path.rglob("*"):
        os.utime(p, (past, past))


def test_the_digest_is_stable_and_changes_with_weights_config_and_tokenizer(tmp_path):
    base = _hf_dir(tmp_path / "a")
    first = dg.checkpoint_digest(base)
    assert first.startswith("sha256:") and len(first) == 7 + 64
    assert dg.checkpoint_digest(base) == first == dg.verify_digest(base)
    assert dg.checkpoint_digest(_hf_dir(tmp_path / "copy")) == first  # content, not location

    edits = {
        "weight byte": lambda p: (p / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x01"),
        "config": lambda p: (p / "config.json").write_text('{"model_type": "qwen3_5_moe"}'),
        "tokenizer": lambda p: (p / "tokenizer.json").write_text('{"vocab": {"b": 0}}'),
        "added file": lambda p: (p / "chat_template.jinja").write_text("{{ x }}"),
        "renamed file": lambda p: (p / "tokenizer_config.json").rename(p / "special.json"),
    }
    seen = {first}
    for name, edit in edits.items():
        changed = _hf_dir(tmp_path / name.replace(" ", "_"))
        edit(changed)
        value = dg.checkpoint_digest(changed)
        assert value not in seen, name
        seen.add(value)

    # Hidden files (caches, temporaries) and the manifest itself are not part of it.
    (base / ".cache").mkdir()
    (base / ".cache" / "x").write_text("y")
    dg.write_digest(base)
    assert dg.checkpoint_digest(base, recompute=True) == first


def test_the_stored_manifest_is_read_while_the_files_are_untouched(tmp_path, monkeypatch):
    path = _hf_dir(tmp_path / "export")
    _age(path)
    stored = dg.write_digest(path)
    manifest = dg.read_manifest(path)
    assert manifest["digest"] == stored and sorted(manifest["files"]) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip

    def no_hashing(path):
        raise AssertionError(f"hashed {path}")

    with monkeypatch.context() as m:
        m.setattr(dg, "file_sha256", no_hashing)
        assert dg.checkpoint_digest(path) == stored  # from the manifest, nothing hashed

    # A weight byte changed after the export: the manifest no longer holds.
    (path / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x02")
    fresh = dg.checkpoint_digest(path)
    assert fresh != stored and fresh == dg.checkpoint_digest(path, recompute=True)
    with pytest.raises(dg.DigestMismatchError, match="changed \\['model.safetensors'\\]") as err:
        dg.verify_digest(path)
    assert stored in str(err.value) and fresh in str(err.value)


def test_a_file_written_in_the_manifests_clock_tick_is_hashed_again(tmp_path):
    path = _hf_dir(tmp_path / "export")
    tick = time.time_ns() - 10**9
    for p in path.iterdir():
        os.utime(p, ns=(tick, tick))
    stored = dg.write_digest(path)
    os.utime(path / dg.DIGEST_FILE, ns=(tick, tick))  # the manifest written in the same tick
    weights = path / "model.safetensors"
    weights.write_bytes(b"\x00" * 63 + b"\x03")  # same size, and the same mtime below
    os.utime(weights, ns=(tick, tick))
    assert dg.checkpoint_digest(path) != stored  # size and mtime match: hashed all the same


def test_an_orbax_checkpoint_hashes_its_params_and_config_only(tmp_path):
    config = models.QwenConfig.preset("tiny", vocab_size=256, max_position_embeddings=64)
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    path = save_params(tmp_path / "ckpt", nnx.state(model, nnx.Param),
                       model_config=config.to_dict())  # fmt: skip
    first = dg.checkpoint_digest(path)
    assert dg.checkpoint_digest(path) == first
    root, tree = dg.digest_files(path)
    assert root == path and "model_config.json" in tree
    assert all(r == "model_config.json" or r.startswith("params/") for r in tree)
    (path / "notes").mkdir()
    (path / "notes" / "x.txt").write_text("not part of what loads")
    assert dg.checkpoint_digest(path) == first
    other = models.Qwen(config, rngs=nnx.Rngs(1))
    moved = save_params(tmp_path / "ckpt2", nnx.state(other, nnx.Param),
                        model_config=config.to_dict())  # fmt: skip
    assert dg.checkpoint_digest(moved) != first
    changed = config.to_dict() | {"rope_theta": 123.0}
    again = save_params(tmp_path / "ckpt3", nnx.state(model, nnx.Param), model_config=changed)
    assert dg.checkpoint_digest(again) != first


def test_the_hf_export_writes_its_digest_and_the_policy_records_it(tmp_path):
    from data.tokenizer import load_tokenizer
    from serve import load_jax_policy

    tokenizer = load_tokenizer()
    config = models.QwenConfig.preset("tiny", vocab_size=len(tokenizer),
                                      max_position_embeddings=256)  # fmt: skip
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    out = convert.save_hf(model, config, tmp_path / "hf", tokenizer_dir=str(DEFAULT_DIR),
                          dtype="float32", progress=False)  # fmt: skip
    manifest = dg.read_manifest(out)
    assert manifest is not None and manifest["digest"] == dg.verify_digest(out)
    names = set(manifest["files"])
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= names
    assert any(n.endswith(".safetensors") for n in names) and dg.DIGEST_FILE not in names
    _, describe = load_jax_policy(str(out), max_length=64)
    assert describe["checkpoint_digest"] == manifest["digest"]
    assert describe["tokenizer_digest"] == dg.tokenizer_digest(DEFAULT_DIR)
    # Exporting other weights over the same directory replaces the manifest.
    other = models.Qwen(config, rngs=nnx.Rngs(1))
    convert.save_hf(other, config, out, tokenizer_dir=str(DEFAULT_DIR), dtype="float32",
                    progress=False)  # fmt: skip
    assert dg.read_manifest(out)["digest"] not in (None, manifest["digest"])
    assert dg.read_manifest(out)["digest"] == dg.verify_digest(out)
