"""QwenConfig: validation names the field, presets, HF config round trips (read by transformers'
own config classes), and full-size parameter counts against transformers on the meta device."""

import dataclasses

import jax
import pytest
import torch
import transformers
from flax import nnx

from models import PRESETS, Qwen, QwenConfig

TINY = QwenConfig.preset("tiny")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"num_kv_heads": 3}, "num_kv_heads"),  # does not divide num_heads=4
        ({"layer_types": ("linear_attention", "dense", "x", "full_attention")}, "layer_types"),
        ({"layer_types": ("full_attention",) * 3}, "layer_types"),  # wrong length
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),  # top-k > experts
        ({"linear_num_key_heads": 3}, "linear_num_key_heads"),  # does not divide 4 value heads
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor"),
        ({"family": "llama"}, "family"),
        ({"moe_dispatch": "padded"}, "moe_dispatch"),
        ({"moe_capacity_factor": 0.0}, "moe_capacity_factor"),
        ({"remat": "sometimes"}, "remat"),
        ({"dtype": "int8"}, "dtype"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size"),
        ({"norm_topk_prob": False}, "norm_topk_prob"),
        ({"scan_unroll": -1}, "scan_unroll"),
    ],
)
def test_invalid_configs_name_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"QwenConfig\.{field}="):
        TINY.replace(**changes)


def test_auto_runtime_values_resolve_per_backend_and_explicit_ones_stay():
    deep = TINY.replace(num_layers=40, layer_types=TINY.layer_types * 10)  # 10 blocks
    # the defaults
    assert (TINY.moe_dispatch, TINY.scan_unroll) == ("auto", 0)
    assert (TINY.attention_impl, TINY.attention_block_size) == ("auto", 0)
    cpu, gpu, tpu = deep.resolved("cpu"), deep.resolved("gpu"), deep.resolved("tpu")
    assert (cpu.moe_dispatch, cpu.scan_unroll) == ("capacity", 8)
    assert (gpu.moe_dispatch, gpu.scan_unroll) == ("ragged", 1)
    assert (tpu.moe_dispatch, tpu.scan_unroll) == ("ragged", 1)
    assert (cpu.attention_impl, cpu.attention_block_size) == ("flash", 256)
    assert (gpu.attention_impl, gpu.attention_block_size) == ("dense", 512)
    assert (tpu.attention_impl, tpu.attention_block_size) == ("dense", 512)
    assert TINY.resolved("cpu").scan_unroll == 1  # one block: nothing to unroll
    explicit = deep.replace(moe_dispatch="sorted", scan_unroll=2, attention_impl="dense",
                            attention_block_size=128)  # fmt: skip
    assert explicit.resolved("cpu") == explicit and explicit.resolved("gpu") == explicit
    # each auto value resolves on its own; the explicit ones beside it stay
    mixed = deep.replace(moe_dispatch="sorted", scan_unroll=2, attention_block_size=64)
    assert mixed.resolved("cpu") == mixed.replace(attention_impl="flash")
    assert mixed.resolved("gpu") == mixed.replace(attention_impl="dense")
    # A model resolves its config when built: `model.config` says what runs here.
    model = nnx.eval_shape(lambda: Qwen(deep, rngs=nnx.Rngs(0)))
    assert model.config == deep.resolved(jax.default_backend())
    assert model.blocks.layers[0].moe.config.moe_dispatch == model.config.moe_dispatch


def test_qwen3_moe_rejects_qwen3_5_only_parts():
    base = PRESETS["qwen3_30b_a3b"]
    with pytest.raises(ValueError, match=r"QwenConfig\.layer_types="):
        base.replace(layer_types=("linear_attention",) + base.layer_types[1:])
    with pytest.raises(ValueError, match=r"QwenConfig\.shared_expert_intermediate_size="):
        base.replace(shared_expert_intermediate_size=64)


def test_presets():
    assert set(PRESETS) >= {"tiny", "small", "qwen3_5_35b_a3b", "qwen3_6_35b_a3b", "qwen3_30b_a3b"}
    assert PRESETS["small"].block_pattern == ("linear_attention",) * 3 + ("full_attention",)
    assert PRESETS["small"].num_blocks == 2  # two full attention layers (tiny: one)
    # the miniature that copies: tiny with every layer full attention, still Qwen3.5-MoE
    copier = PRESETS["tiny_attention"]
    assert copier.is_qwen3_5 and copier.block_pattern == ("full_attention",)
    assert (
        copier.full_attention_interval == 1 and copier.replace(layer_types=TINY.layer_types) == TINY
    )
    big = QwenConfig.preset("qwen3_6_35b_a3b")
    assert big.block_pattern == ("linear_attention",) * 3 + ("full_attention",)
    assert big.num_blocks == 10 and big.full_attention_interval == 4 and big.rotary_dim == 64
    assert PRESETS["qwen3_30b_a3b"].block_pattern == ("full_attention",)
    assert QwenConfig.preset("tiny", vocab_size=100).vocab_size == 100
    with pytest.raises(KeyError, match="unknown QwenConfig preset"):
        QwenConfig.preset("qwen9")


def test_to_dict_round_trip():
    for config in PRESETS.values():
        assert QwenConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown fields"):
        QwenConfig.from_dict({**TINY.to_dict(), "colour": "red"})


def _architecture(config: QwenConfig) -> dict:
    runtime = {"dtype", "param_dtype", "moe_dispatch", "moe_block_size", "remat", "scan_unroll"}
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in runtime}


@pytest.mark.parametrize(
    "name", ["tiny", "tiny_attention", "micro", "small", "qwen3_6_35b_a3b", "qwen3_30b_a3b"]
)
def test_hf_dict_round_trip_through_transformers(name):
    config = PRESETS[name]
    layouts = ["text", "vl"] if config.is_qwen3_5 else ["text"]
    for layout in layouts:
        d = config.to_hf_dict(layout=layout)
        assert _architecture(QwenConfig.from_hf(d)) == _architecture(config)
        hf = transformers.AutoConfig.for_model(**d)
        text = hf.get_text_config()
        assert text.num_experts == config.num_experts
        assert text.num_experts_per_tok == config.num_experts_per_tok
        assert text.rope_parameters["rope_theta"] == config.rope_theta
        back = QwenConfig.from_hf(hf.to_dict())
        assert _architecture(back) == _architecture(config)


def test_hf_dict_writes_every_field_sglang_reads():
    d = PRESETS["qwen3_6_35b_a3b"].to_hf_dict(layout="vl")
    assert d["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    text = d["text_config"]
    expected = {
        "full_attention_interval": 4,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "norm_topk_prob": True,
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "attn_output_gate": True,
        "linear_num_value_heads": 32,
        "mtp_num_hidden_layers": 1,
    }
    assert {k: text[k] for k in expected} == expected
    assert text["rope_parameters"]["mrope_section"] == [11, 11, 10]
    d = PRESETS["qwen3_30b_a3b"].to_hf_dict()
    assert (d["num_experts"], d["rope_theta"], d["norm_topk_prob"]) == (128, 1e6, True)


def test_legacy_hf_config_fields():
    legacy = {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 8,
        "shared_expert_intermediate_size": 8,
        "full_attention_interval": 2,
        "rope_theta": 5e5,
        "partial_rotary_factor": 0.5,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    }
    config = QwenConfig.from_hf(legacy)
    assert config.layer_types == ("linear_attention", "full_attention") * 4
    assert (config.rope_theta, config.partial_rotary_factor) == (5e5, 0.5)
    with pytest.raises(ValueError, match="rope_type"):
        QwenConfig.from_hf({**legacy, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1}})
    with pytest.raises(ValueError, match="model_type"):
        QwenConfig.from_hf({**legacy, "model_type": "llama"})
    with pytest.raises(ValueError, match="mlp_only_layers"):
        QwenConfig.from_hf(PRESETS["qwen3_30b_a3b"].to_hf_dict() | {"mlp_only_layers": [0]})


def _hf_param_count(config: QwenConfig) -> int:
    d = config.to_hf_dict(layout="text")
    hf_config = transformers.AutoConfig.for_model(**d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3_6_35b_a3b", "qwen3_30b_a3b"])
def test_full_size_parameter_count_matches_transformers(name):
    config = PRESETS[name]
    abstract = nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)  # nothing allocated
    ours = sum(leaf.size for leaf in leaves)
    assert ours == _hf_param_count(config)
    assert 30e9 < ours < 40e9
