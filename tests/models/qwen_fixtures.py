"""Tiny random Qwen MoE models built with transformers' own classes, for parity and conversion.

Every parameter is randomised (norm weights, A_log, dt_bias and conv taps included), so a
wrong norm convention, gate layout, transpose or conv orientation shows up in the logits.
The reference runs transformers' eager attention and eager experts (the readable reference
implementations), in float32.
"""

from __future__ import annotations

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from safetensors import safe_open
from transformers import (
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from models import QwenConfig

VOCAB = 512
LENGTH = 520  # >= 512 and not a multiple of the DeltaNet chunk (64)
PAD_FROM = 397  # row 1 is right-padded from here


def qwen3_5_config(layer_types=None, **overrides) -> Qwen3_5MoeTextConfig:
    layer_types = list(layer_types or ["linear_attention"] * 3 + ["full_attention"])
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        linear_conv_kernel_dim=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=8,
        num_experts_per_tok=2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
    )
    fields.update(overrides)
    return Qwen3_5MoeTextConfig(**fields)


def qwen3_moe_config(num_layers: int = 3, **overrides) -> Qwen3MoeConfig:
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        moe_intermediate_size=32,
        intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )
    fields.update(overrides)
    return Qwen3MoeConfig(**fields)


def tiny_qwen3_moe(**overrides) -> QwenConfig:
    """A 2-layer Qwen3-MoE `QwenConfig` (full attention only, 8 experts top-2) for fast tests;
    `overrides` set the vocabulary, dtypes and dispatch each test needs."""
    fields = dict(
        hidden_size=64,
        num_layers=2,
        layer_types=("full_attention",) * 2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        dtype="float32",
        remat="none",
    )
    return QwenConfig.preset("qwen3_30b_a3b").replace(**{**fields, **overrides})


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("A_log"):
                p.copy_(torch.log(0.5 + 3.5 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(noise)
            elif "norm" in name:
                # Zero-centred Gemma norms for Qwen3.5, plain ones for Qwen3 and linear_attn.norm.
                plain = "linear_attn.norm" in name or isinstance(model, Qwen3MoeForCausalLM)
                p.copy_((1.0 if plain else 0.0) + 0.3 * noise)
            else:
                p.copy_(0.08 * noise)


def build(config, seed: int) -> torch.nn.Module:
    """A randomised transformers model in eval mode, eager attention and experts."""
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    cls = Qwen3_5MoeForCausalLM if config.model_type == "qwen3_5_moe_text" else Qwen3MoeForCausalLM
    model = cls(config).eval()
    _randomize(model, seed)
    return model


def save(model: torch.nn.Module, directory: pathlib.Path, *, fused: bool = False) -> pathlib.Path:
    """`save_pretrained` (per-expert tensors unless `fused`)."""
    model.save_pretrained(directory, save_original_format=not fused)
    return directory


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of LENGTH tokens; row 1 right-padded from PAD_FROM. (ids, attention mask)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (2, LENGTH)).astype(np.int64)
    mask = np.ones((2, LENGTH), np.int64)
    mask[1, PAD_FROM:] = 0
    return ids, mask


def reference(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> dict:
    """transformers' logits and aux loss, and the smallest top-k routing margin it used."""
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            output_router_logits=True,
            use_cache=False,
        )
    k = model.config.num_experts_per_tok
    valid = torch.from_numpy(mask).reshape(-1).bool()
    margins = []
    for logits in out.router_logits:
        probs = torch.softmax(logits.float(), -1)[valid]
        top = torch.topk(probs, k + 1, dim=-1).values
        margins.append(float((top[:, k - 1] - top[:, k]).min()))
    return {
        "logits": out.logits.numpy(),
        "aux_loss": float(out.aux_loss),
        "routing_margin": min(margins),
    }


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids, segment_ids, positions):
    model = nnx.merge(graphdef, state)
    return model(ids, segment_ids=segment_ids, positions=positions)


def forward(model, ids, segment_ids=None, positions=None):
    """A jitted forward pass, compiled once per model structure and input shapes."""
    graphdef, state = nnx.split(model)
    return _forward(graphdef, state, jnp.asarray(ids), segment_ids, positions)


def read_exported(directory) -> dict[str, np.ndarray]:
    """Every tensor of an exported HF directory, read with safetensors alone (not our loader);
    checks that the index names each tensor's file and nothing else."""
    directory = pathlib.Path(directory)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(directory / file, "np") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                assert index["weight_map"][name] == file
                out[name] = f.get_tensor(name)
    assert set(out) == set(index["weight_map"])
    return out
