"""The explicit name map between HF Qwen MoE tensors and hat-jax `Qwen` parameters.

hat-jax stores layers stacked: the parameter `blocks/layers/<p>/<sub-path>` has a leading
axis over pattern repeats, and HF layer i is repeat i // P, position i % P of the pattern
(P = len(config.block_pattern)). For every (pattern position, sub-path) this module says
which HF tensors (relative to `<prefix>layers.<i>.`) it is built from and how, and for every
HF tensor how it is built back. Kernels are stored "input first" (`[in, heads, dim]`), HF
weights "output first" (`[out, in]`); the functions below only reshape and transpose, so a
round trip is exact.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from models import QwenConfig

Read = Callable[[str], np.ndarray]  # HF suffix within a layer -> array
Get = Callable[[str], np.ndarray]  # our sub-path within a layer -> per-layer array


def _heads_in(w: np.ndarray, heads: int, dim: int) -> np.ndarray:
    """HF [heads * dim, in] -> ours [in, heads, dim]."""
    return w.reshape(heads, dim, -1).transpose(2, 0, 1)


def _heads_out(w: np.ndarray) -> np.ndarray:
    """Ours [in, heads, dim] -> HF [heads * dim, in]."""
    return w.transpose(1, 2, 0).reshape(-1, w.shape[0])


def _out_in(w: np.ndarray, heads: int, dim: int) -> np.ndarray:
    """HF [out, heads * dim] -> ours [heads, dim, out]."""
    return w.reshape(-1, heads, dim).transpose(1, 2, 0)


def _out_out(w: np.ndarray) -> np.ndarray:
    """Ours [heads, dim, out] -> HF [out, heads * dim]."""
    return w.transpose(2, 0, 1).reshape(w.shape[2], -1)


def hf_layer_shapes(c: QwenConfig, kind: str, experts: str) -> dict[str, tuple[int, ...]]:
    """Expected HF tensors of one layer: suffix -> shape. `experts`: "fused" | "per_expert"."""
    e, x, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (e,),
        "post_attention_layernorm.weight": (e,),
        "mlp.gate.weight": (x, e),
    }
    if kind == "full_attention":
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        shapes.update({
            "self_attn.q_proj.weight": (h * d * (2 if c.attn_output_gate else 1), e),
            "self_attn.k_proj.weight": (kv * d, e),
            "self_attn.v_proj.weight": (kv * d, e),
            "self_attn.o_proj.weight": (e, h * d),
            "self_attn.q_norm.weight": (d,),
            "self_attn.k_norm.weight": (d,),
        })  # fmt: skip
    else:
        kh, vh = c.linear_num_key_heads, c.linear_num_value_heads
        kd, vd = c.linear_key_head_dim, c.linear_value_head_dim
        conv = 2 * kh * kd + vh * vd
        shapes.update({
            "linear_attn.in_proj_qkv.weight": (conv, e),
            "linear_attn.in_proj_z.weight": (vh * vd, e),
            "linear_attn.in_proj_b.weight": (vh, e),
            "linear_attn.in_proj_a.weight": (vh, e),
            "linear_attn.conv1d.weight": (conv, 1, c.linear_conv_kernel_dim),
            "linear_attn.A_log": (vh,),
            "linear_attn.dt_bias": (vh,),
            "linear_attn.norm.weight": (vd,),
            "linear_attn.out_proj.weight": (e, vh * vd),
        })  # fmt: skip
    if experts == "fused":
        shapes["mlp.experts.gate_up_proj"] = (x, 2 * f, e)
        shapes["mlp.experts.down_proj"] = (x, e, f)
    else:
        for i in range(x):
            shapes[f"mlp.experts.{i}.gate_proj.weight"] = (f, e)
            shapes[f"mlp.experts.{i}.up_proj.weight"] = (f, e)
            shapes[f"mlp.experts.{i}.down_proj.weight"] = (e, f)
    s = c.shared_expert_intermediate_size
    if s:
        shapes.update({
            "mlp.shared_expert.gate_proj.weight": (s, e),
            "mlp.shared_expert.up_proj.weight": (s, e),
            "mlp.shared_expert.down_proj.weight": (e, s),
            "mlp.shared_expert_gate.weight": (1, e),
        })  # fmt: skip
    return shapes


def _experts_to_ours(c: QwenConfig, experts: str) -> dict[str, Callable[[Read], np.ndarray]]:
    """Ours: gate_up [E, D, 2, F] (gate then up on axis 2), down [E, F, D]."""
    e, x, f = c.hidden_size, c.num_experts, c.moe_intermediate_size
    if experts == "fused":  # HF gate_up_proj [E, 2F, D]: F gate rows, then F up rows
        return {
            "moe/gate_up_proj": lambda r: (
                r("mlp.experts.gate_up_proj").reshape(x, 2, f, e).transpose(0, 3, 1, 2)
            ),
            "moe/down_proj": lambda r: r("mlp.experts.down_proj").transpose(0, 2, 1),
        }

    def gate_up(r: Read) -> np.ndarray:
        return np.stack(
            [
                np.stack([r(f"mlp.experts.{i}.{n}.weight").T for n in ("gate_proj", "up_proj")], 1)
                for i in range(x)
            ]
        )

    return {
        "moe/gate_up_proj": gate_up,
        "moe/down_proj": lambda r: np.stack(
            [r(f"mlp.experts.{i}.down_proj.weight").T for i in range(x)]
        ),
    }


def ours_from_hf(c: QwenConfig, kind: str, experts: str) -> dict[str, Callable[[Read], np.ndarray]]:
    """For one layer: our sub-path -> function building it from the HF tensors."""
    m: dict[str, Callable[[Read], np.ndarray]] = {
        "input_norm/weight": lambda r: r("input_layernorm.weight"),
        "post_norm/weight": lambda r: r("post_attention_layernorm.weight"),
        "moe/router": lambda r: r("mlp.gate.weight").T,
    }
    if kind == "full_attention":
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        if c.attn_output_gate:  # per head: d query rows, then d gate rows
            q_gate = lambda r: r("self_attn.q_proj.weight").reshape(h, 2, d, -1)  # noqa: E731
            m["mixer/q_proj"] = lambda r: q_gate(r)[:, 0].transpose(2, 0, 1)
            m["mixer/gate_proj"] = lambda r: q_gate(r)[:, 1].transpose(2, 0, 1)
        else:
            m["mixer/q_proj"] = lambda r: _heads_in(r("self_attn.q_proj.weight"), h, d)
        m["mixer/k_proj"] = lambda r: _heads_in(r("self_attn.k_proj.weight"), kv, d)
        m["mixer/v_proj"] = lambda r: _heads_in(r("self_attn.v_proj.weight"), kv, d)
        m["mixer/o_proj"] = lambda r: _out_in(r("self_attn.o_proj.weight"), h, d)
        m["mixer/q_norm/weight"] = lambda r: r("self_attn.q_norm.weight")
        m["mixer/k_norm/weight"] = lambda r: r("self_attn.k_norm.weight")
    else:
        m.update(_deltanet_from_hf(c))
    m.update(_experts_to_ours(c, experts))
    if c.shared_expert_intermediate_size:
        m["moe/shared_gate_up_proj"] = lambda r: np.stack(
            [r(f"mlp.shared_expert.{n}.weight").T for n in ("gate_proj", "up_proj")], axis=1
        )
        m["moe/shared_down_proj"] = lambda r: r("mlp.shared_expert.down_proj.weight").T
        m["moe/shared_expert_gate"] = lambda r: r("mlp.shared_expert_gate.weight")[0]
    return m


def _deltanet_from_hf(c: QwenConfig) -> dict[str, Callable[[Read], np.ndarray]]:
    kh, vh = c.linear_num_key_heads, c.linear_num_value_heads
    kd, vd = c.linear_key_head_dim, c.linear_value_head_dim
    q_end, k_end = kh * kd, 2 * kh * kd
    qkv = lambda r: r("linear_attn.in_proj_qkv.weight")  # noqa: E731
    conv = lambda r: r("linear_attn.conv1d.weight")[:, 0, :]  # noqa: E731  [channels, K]

    def conv_part(r: Read, lo: int, hi: int, heads: int, dim: int) -> np.ndarray:
        return conv(r)[lo:hi].reshape(heads, dim, -1).transpose(2, 0, 1)

    return {
        "mixer/q_proj": lambda r: _heads_in(qkv(r)[:q_end], kh, kd),
        "mixer/k_proj": lambda r: _heads_in(qkv(r)[q_end:k_end], kh, kd),
        "mixer/v_proj": lambda r: _heads_in(qkv(r)[k_end:], vh, vd),
        "mixer/z_proj": lambda r: _heads_in(r("linear_attn.in_proj_z.weight"), vh, vd),
        "mixer/b_proj": lambda r: r("linear_attn.in_proj_b.weight").T,
        "mixer/a_proj": lambda r: r("linear_attn.in_proj_a.weight").T,
        "mixer/q_conv": lambda r: conv_part(r, 0, q_end, kh, kd),
        "mixer/k_conv": lambda r: conv_part(r, q_end, k_end, kh, kd),
        "mixer/v_conv": lambda r: conv_part(r, k_end, None, vh, vd),
        "mixer/A_log": lambda r: r("linear_attn.A_log"),
        "mixer/dt_bias": lambda r: r("linear_attn.dt_bias"),
        "mixer/norm": lambda r: r("linear_attn.norm.weight"),
        "mixer/out_proj": lambda r: _out_in(r("linear_attn.out_proj.weight"), vh, vd),
    }


def hf_from_ours(c: QwenConfig, kind: str, experts: str) -> dict[str, Callable[[Get], np.ndarray]]:
    """For one layer: HF suffix -> function building it from our per-layer arrays."""
    m: dict[str, Callable[[Get], np.ndarray]] = {
        "input_layernorm.weight": lambda g: g("input_norm/weight"),
        "post_attention_layernorm.weight": lambda g: g("post_norm/weight"),
        "mlp.gate.weight": lambda g: g("moe/router").T,
    }
    if kind == "full_attention":
        if c.attn_output_gate:
            m["self_attn.q_proj.weight"] = lambda g: np.stack(
                [g("mixer/q_proj").transpose(1, 2, 0), g("mixer/gate_proj").transpose(1, 2, 0)],
                axis=1,
            ).reshape(-1, c.hidden_size)
        else:
            m["self_attn.q_proj.weight"] = lambda g: _heads_out(g("mixer/q_proj"))
        m["self_attn.k_proj.weight"] = lambda g: _heads_out(g("mixer/k_proj"))
        m["self_attn.v_proj.weight"] = lambda g: _heads_out(g("mixer/v_proj"))
        m["self_attn.o_proj.weight"] = lambda g: _out_out(g("mixer/o_proj"))
        m["self_attn.q_norm.weight"] = lambda g: g("mixer/q_norm/weight")
        m["self_attn.k_norm.weight"] = lambda g: g("mixer/k_norm/weight")
    else:
        m.update(_deltanet_to_hf())
    if experts == "fused":  # ours [E, D, 2, F] -> HF [E, 2F, D]
        m["mlp.experts.gate_up_proj"] = lambda g: (
            g("moe/gate_up_proj").transpose(0, 2, 3, 1).reshape(c.num_experts, -1, c.hidden_size)
        )
        m["mlp.experts.down_proj"] = lambda g: g("moe/down_proj").transpose(0, 2, 1)
    else:
        for i in range(c.num_experts):
            for j, name in enumerate(("gate_proj", "up_proj")):
                m[f"mlp.experts.{i}.{name}.weight"] = lambda g, i=i, j=j: (
                    g("moe/gate_up_proj")[i, :, j].T
                )
            m[f"mlp.experts.{i}.down_proj.weight"] = lambda g, i=i: g("moe/down_proj")[i].T
    if c.shared_expert_intermediate_size:
        m["mlp.shared_expert.gate_proj.weight"] = lambda g: g("moe/shared_gate_up_proj")[:, 0].T
        m["mlp.shared_expert.up_proj.weight"] = lambda g: g("moe/shared_gate_up_proj")[:, 1].T
        m["mlp.shared_expert.down_proj.weight"] = lambda g: g("moe/shared_down_proj").T
        m["mlp.shared_expert_gate.weight"] = lambda g: g("moe/shared_expert_gate")[None]
    return m


def _deltanet_to_hf() -> dict[str, Callable[[Get], np.ndarray]]:
    def conv(g: Get) -> np.ndarray:
        parts = [g(f"mixer/{n}_conv") for n in "qkv"]  # each [K, heads, dim]
        flat = np.concatenate([p.reshape(p.shape[0], -1) for p in parts], axis=1)  # [K, C]
        return flat.T[:, None, :]

    return {
        "linear_attn.in_proj_qkv.weight": lambda g: np.concatenate(
            [_heads_out(g(f"mixer/{n}_proj")) for n in "qkv"], axis=0
        ),
        "linear_attn.in_proj_z.weight": lambda g: _heads_out(g("mixer/z_proj")),
        "linear_attn.in_proj_b.weight": lambda g: g("mixer/b_proj").T,
        "linear_attn.in_proj_a.weight": lambda g: g("mixer/a_proj").T,
        "linear_attn.conv1d.weight": conv,
        "linear_attn.A_log": lambda g: g("mixer/A_log"),
        "linear_attn.dt_bias": lambda g: g("mixer/dt_bias"),
        "linear_attn.norm.weight": lambda g: g("mixer/norm"),
        "linear_attn.out_proj.weight": lambda g: _out_out(g("mixer/out_proj")),
    }


def global_shapes(c: QwenConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """Non-layer HF tensors: full name -> shape."""
    shapes = {
        f"{prefix}embed_tokens.weight": (c.vocab_size, c.hidden_size),
        f"{prefix}norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def global_from_hf(c: QwenConfig, prefix: str) -> dict[str, Callable[[Read], np.ndarray]]:
    m = {
        "embed": lambda r: r(f"{prefix}embed_tokens.weight"),
        "final_norm/weight": lambda r: r(f"{prefix}norm.weight"),
    }
    if not c.tie_word_embeddings:
        m["lm_head"] = lambda r: r("lm_head.weight").T
    return m


def global_to_hf(c: QwenConfig, prefix: str) -> dict[str, Callable[[Get], np.ndarray]]:
    m = {
        f"{prefix}embed_tokens.weight": lambda g: g("embed"),
        f"{prefix}norm.weight": lambda g: g("final_norm/weight"),
    }
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = lambda g: g("lm_head").T
    return m


# -- the MTP (NextN) draft head: 19 `mtp.*` tensors, one full-attention MoE layer -----------

MTP_PREFIX = "mtp."
MTP_LAYER = "mtp.layers.0."


def mtp_shapes(c: QwenConfig, experts: str) -> dict[str, tuple[int, ...]]:
    """Expected `mtp.*` tensors of a Qwen3.5 draft head: full name -> shape."""
    h = c.hidden_size
    shapes = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
    }
    for suffix, shape in hf_layer_shapes(c, "full_attention", experts).items():
        shapes[MTP_LAYER + suffix] = shape
    return shapes


_MTP_GLOBALS = {  # our MTPHead path -> HF name (fc is transposed: ours is input-first)
    "pre_fc_norm_embedding/weight": "mtp.pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden/weight": "mtp.pre_fc_norm_hidden.weight",
    "norm/weight": "mtp.norm.weight",
}


def mtp_from_hf(c: QwenConfig, experts: str) -> dict[str, Callable[[Read], np.ndarray]]:
    """Our `MTPHead` parameter path -> function building it from full HF names."""
    m: dict[str, Callable[[Read], np.ndarray]] = {"fc": lambda r: r("mtp.fc.weight").T}
    for ours, hf in _MTP_GLOBALS.items():
        m[ours] = lambda r, hf=hf: r(hf)
    for sub, build in ours_from_hf(c, "full_attention", experts).items():
        m[f"layer/{sub}"] = lambda r, build=build: build(lambda s: r(MTP_LAYER + s))
    return m


def mtp_to_hf(c: QwenConfig, experts: str) -> dict[str, Callable[[Get], np.ndarray]]:
    """HF `mtp.*` name -> function building it from our `MTPHead` parameter paths."""
    m: dict[str, Callable[[Get], np.ndarray]] = {"mtp.fc.weight": lambda g: g("fc").T}
    for ours, hf in _MTP_GLOBALS.items():
        m[hf] = lambda g, ours=ours: g(ours)
    for suffix, build in hf_from_ours(c, "full_attention", experts).items():
        m[MTP_LAYER + suffix] = lambda g, build=build: build(lambda s: g(f"layer/{s}"))
    return m
