"""HF `config.json` <-> `QwenConfig`.

Reading accepts the three model types of the two families, the transformers-5
`rope_parameters` form and the older top-level `rope_theta` / `rope_scaling` /
`partial_rotary_factor` form. Writing is explicit about every field that SGLang reads,
because SGLang's defaults are Qwen3-Next's (512 experts, top-10, rope theta 1e4) and it
derives layer types from `full_attention_interval`, which transformers' own config save
drops (REFERENCE.md section 2).
"""

from __future__ import annotations

import json
import os
from typing import Any

from models._config import QwenConfig

_RUNTIME_FIELDS = (
    "dtype",
    "param_dtype",
    "moe_dispatch",
    "moe_block_size",
    "moe_capacity_factor",
    "moe_shard_local",
    "moe_expert_parallel",
    "attention_impl",
    "attention_block_size",
    "remat",
    "remat_per_layer",
    "deltanet_chunk_size",
    "scan_unroll",
)

# Vision tower of the released Qwen3.5-MoE checkpoints. hat-jax trains the language model
# only; the VL layout carries this block so the wrapper config parses, and is served with
# `--language-model-only` (no vision weights are written).
_VISION_CONFIG = {
    "model_type": "qwen3_5_moe_vision",
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "initializer_range": 0.02,
}


def _read(path_or_dict: Any) -> dict[str, Any]:
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        return json.load(f)


def _fail(source: str, field: str, value: Any, why: str) -> None:
    raise ValueError(f"HF config {source}: {field}={value!r}: {why}")


def _rope(d: dict[str, Any], source: str) -> dict[str, Any]:
    """RoPE fields from either `rope_parameters` or the legacy top-level keys."""
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        _fail(source, "rope_parameters.rope_type", rope_type, "only 'default' RoPE is supported")
    theta = rope.get("rope_theta", d.get("rope_theta"))
    if theta is None:
        _fail(source, "rope_parameters.rope_theta", None, "missing")
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    section = rope.get("mrope_section")
    return {
        "rope_theta": float(theta),
        "partial_rotary_factor": float(factor) if factor is not None else None,
        "mrope_section": tuple(section) if section is not None else None,
        "mrope_interleaved": bool(rope.get("mrope_interleaved", False)),
    }


def _common(d: dict[str, Any], source: str) -> dict[str, Any]:
    if "num_experts" not in d and "num_local_experts" in d:  # transformers' attribute map
        d = dict(d, num_experts=d["num_local_experts"])
    if d.get("hidden_act", "silu") != "silu":
        _fail(source, "hidden_act", d.get("hidden_act"), "only 'silu' is supported")
    if d.get("attention_bias", False):
        _fail(source, "attention_bias", True, "attention biases are not supported")
    required = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
    )
    for key in required:
        if key not in d:
            _fail(source, key, None, "missing")
    n = int(d["num_hidden_layers"])
    head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
    eos = d.get("eos_token_id")
    return {
        "vocab_size": int(d["vocab_size"]),
        "hidden_size": int(d["hidden_size"]),
        "num_layers": n,
        "num_heads": int(d["num_attention_heads"]),
        "num_kv_heads": int(d["num_key_value_heads"]),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "num_experts": int(d["num_experts"]),
        "num_experts_per_tok": int(d["num_experts_per_tok"]),
        "moe_intermediate_size": int(d["moe_intermediate_size"]),
        "router_aux_loss_coef": float(d.get("router_aux_loss_coef", 0.001)),
        "max_position_embeddings": int(d.get("max_position_embeddings", 32_768)),
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_id": tuple(eos) if isinstance(eos, list) else eos,
        "pad_token_id": d.get("pad_token_id"),
        "initializer_range": float(d.get("initializer_range", 0.02)),
    }


def _qwen3_5(d: dict[str, Any], top: dict[str, Any], source: str) -> dict[str, Any]:
    fields = _common(d, source)
    n = fields["num_layers"]
    layer_types = d.get("layer_types")
    if layer_types is None:
        interval = int(d.get("full_attention_interval", 4))
        layer_types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    rope = _rope(d, source)
    if rope["partial_rotary_factor"] is None:
        rope["partial_rotary_factor"] = 0.25  # transformers' default for this family
    tie = top.get("tie_word_embeddings", d.get("tie_word_embeddings", False))
    fields.update(
        family="qwen3_5_moe",
        layer_types=tuple(layer_types),
        linear_num_key_heads=int(d.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(d.get("linear_num_value_heads", 32)),
        linear_key_head_dim=int(d.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(d.get("linear_value_head_dim", 128)),
        linear_conv_kernel_dim=int(d.get("linear_conv_kernel_dim", 4)),
        shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size", 512)),
        norm_topk_prob=True,
        tie_word_embeddings=bool(tie),
        mtp_num_hidden_layers=int(d.get("mtp_num_hidden_layers", 0)),
        **rope,
    )
    return fields


def _qwen3_moe(d: dict[str, Any], source: str) -> dict[str, Any]:
    fields = _common(d, source)
    if d.get("mlp_only_layers"):
        _fail(source, "mlp_only_layers", d["mlp_only_layers"], "dense MLP layers not supported")
    if int(d.get("decoder_sparse_step", 1)) != 1:
        _fail(source, "decoder_sparse_step", d["decoder_sparse_step"], "must be 1 (all MoE)")
    if d.get("use_sliding_window", False):
        _fail(source, "use_sliding_window", True, "sliding-window attention not supported")
    rope = _rope(d, source)
    rope["partial_rotary_factor"] = rope["partial_rotary_factor"] or 1.0
    fields.update(
        family="qwen3_moe",
        layer_types=("full_attention",) * fields["num_layers"],
        norm_topk_prob=bool(d.get("norm_topk_prob", False)),
        intermediate_size=int(d.get("intermediate_size", 0)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        **rope,
    )
    return fields


def config_from_hf(path_or_dict: Any, **runtime: Any) -> QwenConfig:
    """See `QwenConfig.from_hf`."""
    source = path_or_dict if not isinstance(path_or_dict, dict) else "<dict>"
    top = _read(path_or_dict)
    unknown = set(runtime) - set(_RUNTIME_FIELDS)
    if unknown:
        raise ValueError(f"from_hf: {sorted(unknown)} are not runtime fields {_RUNTIME_FIELDS}")
    model_type = top.get("model_type")
    if model_type == "qwen3_5_moe":
        if not isinstance(top.get("text_config"), dict):
            _fail(source, "text_config", top.get("text_config"), "qwen3_5_moe needs a dict")
        fields = _qwen3_5(top["text_config"], top, source)
    elif model_type == "qwen3_5_moe_text":
        fields = _qwen3_5(top, top, source)
    elif model_type == "qwen3_moe":
        fields = _qwen3_moe(top, source)
    else:
        _fail(
            source, "model_type", model_type, "expected qwen3_5_moe, qwen3_5_moe_text or qwen3_moe"
        )
    return QwenConfig(**fields, **runtime)


def _rope_dict(c: QwenConfig) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.is_qwen3_5 or c.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = c.partial_rotary_factor
    if c.mrope_section is not None:
        rope["mrope_section"] = list(c.mrope_section)
        rope["mrope_interleaved"] = c.mrope_interleaved
    return rope


def _shared_fields(c: QwenConfig) -> dict[str, Any]:
    eos = list(c.eos_token_id) if isinstance(c.eos_token_id, tuple) else c.eos_token_id
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "initializer_range": c.initializer_range,
        "tie_word_embeddings": c.tie_word_embeddings,
        "use_cache": True,
        # RoPE: transformers reads rope_parameters, SGLang also reads the top-level keys.
        "rope_parameters": _rope_dict(c),
        "rope_theta": c.rope_theta,
        "partial_rotary_factor": c.partial_rotary_factor,
        # MoE: all explicit (SGLang's defaults are another model's).
        "num_experts": c.num_experts,
        "num_experts_per_tok": c.num_experts_per_tok,
        "moe_intermediate_size": c.moe_intermediate_size,
        "norm_topk_prob": c.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": c.router_aux_loss_coef,
        "output_router_logits": False,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": c.pad_token_id,
        "dtype": c.param_dtype,
    }


def _qwen3_5_text_dict(c: QwenConfig) -> dict[str, Any]:
    interval = c.full_attention_interval
    if interval is None:
        raise ValueError(
            f"QwenConfig.layer_types={c.layer_types!r}: no full_attention_interval reproduces "
            "this pattern, and SGLang derives layer types from that interval alone"
        )
    d = _shared_fields(c)
    d.update(
        architectures=["Qwen3_5MoeForCausalLM"],
        model_type="qwen3_5_moe_text",
        layer_types=list(c.layer_types),
        full_attention_interval=interval,
        attn_output_gate=True,
        linear_num_key_heads=c.linear_num_key_heads,
        linear_num_value_heads=c.linear_num_value_heads,
        linear_key_head_dim=c.linear_key_head_dim,
        linear_value_head_dim=c.linear_value_head_dim,
        linear_conv_kernel_dim=c.linear_conv_kernel_dim,
        shared_expert_intermediate_size=c.shared_expert_intermediate_size,
        mtp_num_hidden_layers=c.mtp_num_hidden_layers,
        mtp_use_dedicated_embeddings=False,
    )
    return d


def config_to_hf(c: QwenConfig, *, layout: str = "text") -> dict[str, Any]:
    """See `QwenConfig.to_hf_dict`."""
    if layout not in ("text", "vl"):
        raise ValueError(f"to_hf_dict: layout={layout!r} must be 'text' or 'vl'")
    if not c.is_qwen3_5:
        if layout != "text":
            raise ValueError(f"to_hf_dict: layout={layout!r}: qwen3_moe has only the text layout")
        d = _shared_fields(c)
        d.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            intermediate_size=c.intermediate_size or 4 * c.hidden_size,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=c.num_layers,
        )
        return d
    text = _qwen3_5_text_dict(c)
    if layout == "text":
        return text
    text.pop("architectures")
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": dict(_VISION_CONFIG, out_hidden_size=c.hidden_size),
        "tie_word_embeddings": c.tie_word_embeddings,
        "image_token_id": 248_056,
        "video_token_id": 248_057,
        "vision_start_token_id": 248_053,
        "vision_end_token_id": 248_054,
        "dtype": c.param_dtype,
    }
