"""HF <-> hat-jax conversion: exact round trips, exports that transformers loads with the same
logits (and generation config), the SGLang config fields, no truncated file after a crash
mid-export, errors that name tensors, MTP tensors, and the CLI."""

import json
import logging

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from flax import nnx

from hat_jax.sharding import MeshConfig, make_mesh, state_shardings
from serve import HFCheckpointError, load_hf, read_hf_tensors, save_hf
from serve.convert import abstract_qwen
from serve.convert import main as convert_main
from tests.models.qwen_fixtures import (
    build,
    qwen3_5_config,
    qwen3_moe_config,
    read_exported,
    save,
)

SOURCES = {
    "qwen3_5_per_expert": (lambda: qwen3_5_config(), False),
    "qwen3_5_fused": (lambda: qwen3_5_config(), True),
    "qwen3_moe_per_expert": (lambda: qwen3_moe_config(num_layers=2), False),
}


def _source_tensors(directory) -> dict[str, np.ndarray]:
    return safetensors.numpy.load_file(directory / "model.safetensors")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """name -> (transformers model, its save_pretrained directory)."""
    out = {}
    for i, (name, (make, fused)) in enumerate(sorted(SOURCES.items())):
        model = build(make(), seed=10 + i)
        out[name] = (model, save(model, tmp_path_factory.mktemp(name), fused=fused))
    return out


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_hf_to_ours_to_hf_reproduces_every_tensor(name, sources, tmp_path):
    _, src = sources[name]
    config, model = load_hf(src, dtype="float32")
    experts = "fused" if SOURCES[name][1] else "per_expert"
    out = save_hf(model, config, tmp_path, dtype="float32", layout="text",
                  expert_layout=experts, max_shard_bytes=100_000)  # fmt: skip
    original, exported = _source_tensors(src), read_exported(out)
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        assert exported[key].dtype == value.dtype and np.array_equal(exported[key], value), key
    assert len(list(out.glob("model-*.safetensors"))) > 1  # sharded, with an index


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()


@pytest.mark.parametrize("name", ["qwen3_5_per_expert", "qwen3_moe_per_expert"])
def test_default_export_loads_in_transformers_with_the_same_logits(name, sources, tmp_path):
    hf_model, src = sources[name]
    config, model = load_hf(src, dtype="float32")
    # Special tokens for generation_config.json (the fixtures set none); Qwen3.5 with an eos list.
    eos = (2, 3) if config.is_qwen3_5 else 2
    config = config.replace(bos_token_id=1, eos_token_id=eos, pad_token_id=0)
    out = save_hf(model, config, tmp_path / "export", dtype="float32")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager", experts_implementation="eager"
    )
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 96))
    np.testing.assert_array_equal(_logits(loaded, ids), _logits(hf_model, ids))
    written = json.loads((out / "config.json").read_text())
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.bos_token_id, generation.pad_token_id) == (1, 0)
    assert generation.eos_token_id == ([2, 3] if config.is_qwen3_5 else 2)
    _assert_recommended_sampling(generation)
    if config.is_qwen3_5:  # the vision-language wrapper SGLang serves (--language-model-only)
        assert written["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
        text = written["text_config"]
        assert text["full_attention_interval"] == 4 and text["rope_theta"] == 1e6
        assert "model.language_model.embed_tokens.weight" in read_exported(out)
        assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in read_exported(out)
        # ... and it reads back into the same parameters.
        again_config, again = load_hf(out, dtype="float32")
        assert again_config == config
        np.testing.assert_array_equal(again.lm_head[...], model.lm_head[...])
    else:  # SGLang's qwen3_moe loader reads per-expert tensors only
        assert written["architectures"] == ["Qwen3MoeForCausalLM"]
        assert written["num_experts"] == 8 and "model.layers.0.mlp.experts.7.up_proj.weight" in (
            read_exported(out)
        )


def _assert_recommended_sampling(generation) -> None:
    """The sampling every export recommends (serve/_hf_files.py: Qwen3 thinking mode)."""
    assert generation.do_sample is True
    assert (generation.temperature, generation.top_p, generation.top_k) == (0.6, 0.95, 20)


def test_load_straight_into_a_sharded_layout(sources):
    _, src = sources["qwen3_5_fused"]
    config, plain = load_hf(src, dtype="float32")
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2))
    shardings = state_shardings(nnx.state(abstract_qwen(config), nnx.Param), mesh)
    _, sharded = load_hf(src, dtype="float32", shardings=shardings)
    experts = sharded.blocks.layers[0].moe.gate_up_proj.get_value()
    assert experts.sharding.spec[1] == ("expert", "fsdp") and len(experts.sharding.device_set) == 8
    for a, b in zip(jax.tree.leaves(nnx.state(sharded)), jax.tree.leaves(nnx.state(plain))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bfloat16_export_matches_torch_rounding(sources, tmp_path):
    _, src = sources["qwen3_5_fused"]
    config, model = load_hf(src, dtype="float32")
    out = save_hf(model, config, tmp_path, dtype="bfloat16", layout="text")
    exported = read_exported(out)
    for key, value in _source_tensors(src).items():
        want = torch.from_numpy(value).to(torch.bfloat16).view(torch.int16).numpy()
        assert exported[key].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(exported[key].view(np.int16), want, err_msg=key)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_crash_mid_export_leaves_no_truncated_file(sources, tmp_path, monkeypatch):
    _, src = sources["qwen3_moe_per_expert"]
    config, model = load_hf(src, dtype="float32")
    written, save_file = [], safetensors.numpy.save_file

    def dies_in_the_second_shard(tensors, filename, metadata=None):
        written.append(filename)
        if len(written) == 2:
            with open(filename, "wb") as f:
                f.write(b"half a shard")
            raise RuntimeError("killed mid-write")
        save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.numpy, "save_file", dies_in_the_second_shard)
    out = tmp_path / "export"
    with pytest.raises(RuntimeError, match="mid-write"):
        save_hf(model, config, out, dtype="float32", max_shard_bytes=100_000)
    (shard,) = sorted(p.name for p in out.iterdir())
    assert shard.startswith("model-00001-of-")
    assert all(str(name).endswith(".tmp") for name in written), "only temporary names written"
    assert len(safetensors.numpy.load_file(out / shard)) > 0  # complete, or not there at all


def _edited_copy(src, dst, edit) -> None:
    tensors = _source_tensors(src)
    edit(tensors)
    dst.mkdir()
    safetensors.numpy.save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())


def test_broken_checkpoints_name_the_tensors(sources, tmp_path):
    _, src = sources["qwen3_moe_per_expert"]
    gate = "model.layers.1.mlp.gate.weight"
    _edited_copy(src, tmp_path / "missing", lambda t: t.pop(gate))
    with pytest.raises(HFCheckpointError, match=rf"1 missing: {gate}"):
        load_hf(tmp_path / "missing")
    _edited_copy(src, tmp_path / "extra", lambda t: t.update({"model.layers.2.x": np.ones(1)}))
    with pytest.raises(HFCheckpointError, match=r"1 unexpected: model\.layers\.2\.x"):
        load_hf(tmp_path / "extra")
    _edited_copy(src, tmp_path / "shape", lambda t: t.update({gate: np.ones((8, 63), np.float32)}))
    with pytest.raises(HFCheckpointError, match=rf"{gate}: file \(8, 63\) vs expected \(8, 64\)"):
        load_hf(tmp_path / "shape")


def test_mtp_tensors_are_left_to_load_mtp_and_can_be_carried(sources, tmp_path, caplog):
    _, src = sources["qwen3_5_fused"]
    mtp = {"mtp.fc.weight": np.arange(64 * 128, dtype=np.float32).reshape(64, 128)}
    _edited_copy(src, tmp_path / "with_mtp", lambda t: t.update(mtp))
    with caplog.at_level(logging.INFO):
        config, model = load_hf(tmp_path / "with_mtp")
    assert "1 mtp.* tensors (the MTP draft head) left for load_mtp" in caplog.text
    carried = read_hf_tensors(tmp_path / "with_mtp", "mtp.")
    out = save_hf(model, config, tmp_path / "out", dtype="float32", extra_tensors=carried)
    np.testing.assert_array_equal(read_exported(out)["mtp.fc.weight"], mtp["mtp.fc.weight"])


def test_cli_round_trip_through_an_orbax_checkpoint(sources, tmp_path):
    _, src = sources["qwen3_5_per_expert"]
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text('{"model_max_length": 4096}')
    # A base checkpoint's own generation config: its end tokens and sampling values are kept.
    (tokenizer / "generation_config.json").write_text(
        '{"eos_token_id": [7, 9], "temperature": 0.7}'
    )
    checkpoint, out = tmp_path / "orbax", tmp_path / "hf"
    convert_main(["from-hf", "--hf_dir", str(src), "--out", str(checkpoint)])
    assert (checkpoint / "model_config.json").is_file()
    convert_main([
        "to-hf", "--checkpoint", str(checkpoint), "--out", str(out), "--dtype", "float32",
        "--layout", "text", "--expert_layout", "per_expert", "--tokenizer_dir", str(tokenizer),
    ])  # fmt: skip
    original, exported = _source_tensors(src), read_exported(out)
    assert sorted(exported) == sorted(original)
    assert all(np.array_equal(exported[k], v) for k, v in original.items())
    assert (out / "tokenizer_config.json").read_text() == '{"model_max_length": 4096}'
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == [7, 9]  # the source config sets none; the base's stay
    assert (generation.temperature, generation.top_p, generation.top_k) == (0.7, 0.95, 20)
    assert not list(out.glob(".*")), "no temporary file left behind"
