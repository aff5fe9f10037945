# Over 400 lines: most of it is the presets' data; the logic is the validation.
"""`QwenConfig`: the one frozen description of a Qwen MoE policy, its validation and presets.

Two HF families share this config: `qwen3_5_moe` (Qwen3.5/3.6 MoE: Gated-DeltaNet and gated
full-attention layers, a sigmoid-gated shared expert, zero-centred "1 + w" RMSNorm weights)
and `qwen3_moe` (Qwen3-MoE: full attention only, no shared expert, plain "w" RMSNorm weights).
The architecture fields mirror the HF `config.json` names; the runtime fields (dtypes, MoE
dispatch, remat, DeltaNet chunk size) choose how the same math runs and never reach HF.
Conversion to and from HF config dictionaries lives in `_hf_config.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

FAMILIES = ("qwen3_5_moe", "qwen3_moe")
LAYER_TYPES = ("linear_attention", "full_attention")
MOE_DISPATCHES = ("dense", "sorted", "capacity", "ragged")
AUTO = "auto"
# What "auto" runtime values become on each JAX backend (`QwenConfig.resolved`): the
# capacity grid is fastest on CPU (batched matmuls XLA:CPU runs well; `bench/bench_model.py`),
# ragged_dot is the accelerators' grouped matmul.
AUTO_MOE_DISPATCH = {"cpu": "capacity"}
AUTO_MOE_DISPATCH_OTHER = "ragged"
AUTO_SCAN_UNROLL_CPU = 8  # unroll shallow models on CPU; accelerators keep a rolled scan
# Full attention: block-wise with 256-position blocks on CPU (score tiles that stay in cache:
# the demo's SFT step at 2 x 5,376 tokens runs 1.7x faster than with the dense [T, T]
# scores, `python -m bench.bench_sft --only attention`); accelerators keep the dense scores,
# as before (not measured there; a config that needs O(T) memory asks for "flash").
AUTO_ATTENTION = {"cpu": "flash"}
AUTO_ATTENTION_OTHER = "dense"
AUTO_ATTENTION_BLOCK = {"cpu": 256}
AUTO_ATTENTION_BLOCK_OTHER = 512
REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch")
ATTENTION_IMPLS = ("dense", "flash")
DTYPES = ("float32", "bfloat16", "float16")


def _interval_layer_types(num_layers: int, interval: int) -> tuple[str, ...]:
    """HF's rule: layer i is full attention iff (i + 1) % interval == 0."""
    return tuple(
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(num_layers)
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class QwenConfig:
    """Architecture and runtime choices of a Qwen MoE decoder.

    Architecture (HF names in brackets where they differ):
        family: "qwen3_5_moe" (Qwen3.5/3.6 MoE) or "qwen3_moe" (Qwen3-MoE).
        vocab_size, hidden_size: token vocabulary and residual width.
        num_layers [num_hidden_layers]: decoder layers.
        layer_types: per layer "linear_attention" (Gated DeltaNet) or "full_attention".
        num_heads [num_attention_heads], num_kv_heads [num_key_value_heads], head_dim:
            grouped-query attention shape.
        rope_theta, partial_rotary_factor: RoPE base and the fraction of head_dim rotated.
        mrope_section, mrope_interleaved: the multimodal RoPE layout of Qwen3.5. For text all
            three position rows are equal, so the model applies ordinary RoPE; the fields are
            kept so exported configs match the originals.
        rms_norm_eps: epsilon of every RMSNorm (and of the DeltaNet output norm).
        linear_*: Gated DeltaNet key/value heads, head dims and causal conv kernel width.
        num_experts, num_experts_per_tok, moe_intermediate_size: routed SwiGLU experts.
        shared_expert_intermediate_size: width of the sigmoid-gated shared expert (0: none).
        norm_topk_prob: renormalise the top-k router probabilities to sum to 1.
        router_aux_loss_coef: weight of the load-balancing loss (applied by the loss, not
            by the model, which returns the unscaled `aux_loss`).
        intermediate_size: dense MLP width of `qwen3_moe` configs (exported only; every
            layer of the supported configs is MoE).
        tie_word_embeddings: share the embedding with the LM head.
        max_position_embeddings, bos/eos/pad_token_id, mtp_num_hidden_layers,
        initializer_range: carried to and from HF configs.

    Runtime:
        dtype, param_dtype: compute and storage dtypes ("float32", "bfloat16", "float16").
            Norms, softmaxes, routing and the delta rule always run in float32.
        moe_dispatch: "auto" (default: "capacity" on CPU, "ragged" on GPU/TPU, resolved when
            a model is built, see `resolved`), "dense" (every expert on every token: the
            reference), "sorted" (sort tokens by expert, a loop over row blocks), "capacity"
            (sorted into an [experts, capacity] grid run as batched matmuls, overflow through
            the block loop: fastest on CPU) or "ragged" (`jax.lax.ragged_dot`: for GPU/TPU).
            All are dropless and agree (`models._moe`).
        moe_block_size: row block of the "sorted" dispatch's loop (and of "capacity"'s
            overflow loop).
        moe_capacity_factor: rows per expert of the "capacity" grid, as a multiple of the
            mean (tokens x top-k / experts); rows beyond it are still computed, by the loop.
        moe_shard_local: under a mesh, run the dispatch per shard of the tokens
            (`models._moe_sharded`): each device sorts only its own tokens, against expert
            weights gathered whole. Same numbers; for training with a sharded batch.
        moe_expert_parallel: under a mesh, each device runs only the experts it stores on
            the tokens of its expert group (tokens all-gathered, outputs reduce-scattered;
            `models._moe_sharded`): expert weights and their gradients never move. Same
            numbers; with "sorted" it uses the memory-lean gathered block loop. Takes
            precedence over `moe_shard_local`.
        attention_impl: full-attention layers without a cache: "dense" (the [T, T] score
            matrix) or "flash" (`models._flash`: blocks of `attention_block_size`, online
            softmax, O(T) memory; used when T exceeds one block). Same numbers. "auto"
            (default): "flash" on CPU, "dense" on GPU/TPU.
        attention_block_size: query/key block length of "flash" attention; 0 (default):
            auto, 256 on CPU and 512 elsewhere.
        remat: activation checkpointing of each scanned block: "none", "full",
            "save_dots" (keep matmul outputs) or "save_dots_no_batch".
        remat_per_layer: also checkpoint each layer inside a block (nested), so the backward
            pass of a block holds one layer's recomputed activations at a time, not all of
            the block's (3 DeltaNet + 1 attention layers for Qwen3.5). Same numbers.
        deltanet_chunk_size: chunk length of the chunked gated delta rule.
        scan_unroll: blocks per iteration of the layer scan: 1 keeps compile time flat in
            depth; unrolling a shallow model (CPU, demo) lets XLA drop the per-iteration
            slicing and gradient-accumulation copies of the stacked parameters. 0 (default):
            auto, up to 8 blocks on CPU and 1 elsewhere.
    """

    family: str = "qwen3_5_moe"
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 1.0
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    rms_norm_eps: float = 1e-6
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    intermediate_size: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32_768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    mtp_num_hidden_layers: int = 0
    initializer_range: float = 0.02
    # Runtime choices: how the math runs, never exported.
    dtype: str = "float32"
    param_dtype: str = "float32"
    moe_dispatch: str = AUTO
    moe_block_size: int = 128
    moe_capacity_factor: float = 1.25
    moe_shard_local: bool = False
    moe_expert_parallel: bool = False
    attention_impl: str = AUTO
    attention_block_size: int = 0
    remat: str = "none"
    remat_per_layer: bool = False
    deltanet_chunk_size: int = 64
    scan_unroll: int = 0

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        _validate(self)

    # Derived values (computed, never stored).
    @property
    def is_qwen3_5(self) -> bool:
        return self.family == "qwen3_5_moe"

    @property
    def attn_output_gate(self) -> bool:
        """Qwen3.5 gates the attention output with sigmoid(gate), the gate rows in q_proj."""
        return self.is_qwen3_5

    @property
    def norm_offset(self) -> float:
        """RMSNorm scale is (offset + w): 1 for Qwen3.5's zero-centred weights, else 0."""
        return 1.0 if self.is_qwen3_5 else 0.0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def block_pattern(self) -> tuple[str, ...]:
        """The shortest repeating unit of `layer_types`; the decoder scans over its repeats."""
        n = self.num_layers
        for period in range(1, n + 1):
            if n % period == 0 and self.layer_types == self.layer_types[:period] * (n // period):
                return self.layer_types[:period]
        raise AssertionError("unreachable: the full list is always a period")

    @property
    def num_blocks(self) -> int:
        return self.num_layers // len(self.block_pattern)

    @property
    def full_attention_interval(self) -> int | None:
        """The HF/SGLang interval that reproduces `layer_types`, or None if none does."""
        for interval in range(1, self.num_layers + 2):
            if _interval_layer_types(self.num_layers, interval) == self.layer_types:
                return interval
        return None

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-friendly values (what checkpoints store beside the weights)."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QwenConfig:
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"QwenConfig.from_dict: unknown fields {unknown}")
        return cls(**d)

    def resolved(self, backend: str | None = None) -> QwenConfig:
        """This config with its "auto" runtime values made concrete for `backend` (JAX's
        default backend when None): `moe_dispatch` "capacity" on CPU, "ragged" on GPU/TPU;
        `scan_unroll` every block up to 8 on CPU, 1 elsewhere; `attention_impl` "flash" on
        CPU, "dense" elsewhere; `attention_block_size` 256 on CPU, 512 elsewhere. Explicit
        values are kept. Models resolve their config when built, so `model.config` says what
        runs."""
        concrete = (self.moe_dispatch != AUTO and self.scan_unroll > 0
                    and self.attention_impl != AUTO and self.attention_block_size > 0)  # fmt: skip
        if concrete:
            return self
        if backend is None:
            import jax

            backend = jax.default_backend()
        changes: dict[str, Any] = {}
        if self.moe_dispatch == AUTO:
            changes["moe_dispatch"] = AUTO_MOE_DISPATCH.get(backend, AUTO_MOE_DISPATCH_OTHER)
        if self.attention_impl == AUTO:
            changes["attention_impl"] = AUTO_ATTENTION.get(backend, AUTO_ATTENTION_OTHER)
        if self.attention_block_size == 0:
            block = AUTO_ATTENTION_BLOCK.get(backend, AUTO_ATTENTION_BLOCK_OTHER)
            changes["attention_block_size"] = block
        if self.scan_unroll == 0:
            cpu = backend == "cpu"
            changes["scan_unroll"] = min(self.num_blocks, AUTO_SCAN_UNROLL_CPU) if cpu else 1
        return self.replace(**changes)

    def replace(self, **changes: Any) -> QwenConfig:
        """A copy with `changes` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> QwenConfig:
        """A named preset (see `PRESETS`), optionally with fields overridden."""
        if name not in PRESETS:
            raise KeyError(f"unknown QwenConfig preset {name!r}; known: {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]

    @classmethod
    def from_hf(cls, path_or_dict: Any, **runtime: Any) -> QwenConfig:
        """Reads an HF `config.json` (a directory, a file path or the parsed dict).

        Accepts `qwen3_5_moe` (vision-language, reads `text_config`), `qwen3_5_moe_text` and
        `qwen3_moe`. `runtime` sets runtime fields (dtype, moe_dispatch, ...).
        """
        from models._hf_config import config_from_hf

        return config_from_hf(path_or_dict, **runtime)

    def to_hf_dict(self, *, layout: str = "text") -> dict[str, Any]:
        """The HF `config.json` dict, every field SGLang reads written explicitly.

        `layout="text"` gives the text-only model (`qwen3_5_moe_text` / `qwen3_moe`);
        `layout="vl"` (Qwen3.5 only) the vision-language wrapper `qwen3_5_moe` that SGLang
        serves with `--language-model-only`.
        """
        from models._hf_config import config_to_hf

        return config_to_hf(self, layout=layout)


def _check(condition: bool, field: str, value: Any, why: str) -> None:
    if not condition:
        raise ValueError(f"QwenConfig.{field}={value!r}: {why}")


def _validate(c: QwenConfig) -> None:
    _check(c.family in FAMILIES, "family", c.family, f"must be one of {FAMILIES}")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads"):
        _check(getattr(c, name) > 0, name, getattr(c, name), "must be positive")
    for name in ("head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        _check(getattr(c, name) > 0, name, getattr(c, name), "must be positive")
    _check(
        len(c.layer_types) == c.num_layers,
        "layer_types",
        c.layer_types,
        f"needs one entry per layer (num_layers={c.num_layers})",
    )
    for t in c.layer_types:
        _check(t in LAYER_TYPES, "layer_types", t, f"unknown layer type; known: {LAYER_TYPES}")
    _check(
        c.num_heads % c.num_kv_heads == 0,
        "num_kv_heads",
        c.num_kv_heads,
        f"must divide num_heads={c.num_heads}",
    )
    _check(
        c.num_experts_per_tok <= c.num_experts,
        "num_experts_per_tok",
        c.num_experts_per_tok,
        f"top-k cannot exceed num_experts={c.num_experts}",
    )
    _check(
        0.0 < c.partial_rotary_factor <= 1.0,
        "partial_rotary_factor",
        c.partial_rotary_factor,
        "must be in (0, 1]",
    )
    _check(
        c.rotary_dim % 2 == 0 and c.rotary_dim > 0,
        "partial_rotary_factor",
        c.partial_rotary_factor,
        f"head_dim * factor must be a positive even number (head_dim={c.head_dim})",
    )
    _check(c.rope_theta > 0, "rope_theta", c.rope_theta, "must be positive")
    _check(c.rms_norm_eps > 0, "rms_norm_eps", c.rms_norm_eps, "must be positive")
    _check(c.shared_expert_intermediate_size >= 0, "shared_expert_intermediate_size",
           c.shared_expert_intermediate_size, "must be >= 0")  # fmt: skip
    _validate_family(c)
    _validate_runtime(c)


def _validate_family(c: QwenConfig) -> None:
    if c.is_qwen3_5:
        _check(c.norm_topk_prob, "norm_topk_prob", c.norm_topk_prob,
               "qwen3_5_moe always renormalises the top-k probabilities")  # fmt: skip
        _check(c.shared_expert_intermediate_size > 0, "shared_expert_intermediate_size",
               c.shared_expert_intermediate_size, "qwen3_5_moe has a shared expert")  # fmt: skip
        if "linear_attention" in c.layer_types:
            for name in ("linear_num_key_heads", "linear_num_value_heads",
                         "linear_key_head_dim", "linear_value_head_dim",
                         "linear_conv_kernel_dim"):  # fmt: skip
                _check(getattr(c, name) > 0, name, getattr(c, name),
                       "must be positive when there are linear_attention layers")  # fmt: skip
            _check(
                c.linear_num_value_heads % c.linear_num_key_heads == 0,
                "linear_num_key_heads",
                c.linear_num_key_heads,
                f"must divide linear_num_value_heads={c.linear_num_value_heads}",
            )
    else:
        _check(all(t == "full_attention" for t in c.layer_types), "layer_types",
               c.layer_types, "qwen3_moe has only full_attention layers")  # fmt: skip
        _check(c.shared_expert_intermediate_size == 0, "shared_expert_intermediate_size",
               c.shared_expert_intermediate_size, "qwen3_moe has no shared expert")  # fmt: skip
        _check(c.mtp_num_hidden_layers == 0, "mtp_num_hidden_layers",
               c.mtp_num_hidden_layers, "qwen3_moe has no MTP head")  # fmt: skip


def _validate_runtime(c: QwenConfig) -> None:
    _check(c.dtype in DTYPES, "dtype", c.dtype, f"must be one of {DTYPES}")
    _check(c.param_dtype in DTYPES, "param_dtype", c.param_dtype, f"must be one of {DTYPES}")
    _check(c.moe_dispatch in (AUTO, *MOE_DISPATCHES), "moe_dispatch", c.moe_dispatch,
           f"must be {AUTO!r} or one of {MOE_DISPATCHES}")  # fmt: skip
    _check(c.remat in REMAT_POLICIES, "remat", c.remat, f"must be one of {REMAT_POLICIES}")
    _check(c.moe_block_size > 0, "moe_block_size", c.moe_block_size, "must be positive")
    _check(c.moe_capacity_factor > 0, "moe_capacity_factor", c.moe_capacity_factor,
           "must be positive")  # fmt: skip
    _check(c.attention_impl in (AUTO, *ATTENTION_IMPLS), "attention_impl", c.attention_impl,
           f"must be {AUTO!r} or one of {ATTENTION_IMPLS}")  # fmt: skip
    _check(c.attention_block_size >= 0, "attention_block_size", c.attention_block_size,
           "must be >= 0 (0: auto)")  # fmt: skip
    _check(c.deltanet_chunk_size > 0, "deltanet_chunk_size", c.deltanet_chunk_size,
           "must be positive")  # fmt: skip
    _check(c.scan_unroll >= 0, "scan_unroll", c.scan_unroll, "must be >= 0 (0: auto)")


def _qwen3_5_35b_a3b(**extra: Any) -> QwenConfig:
    return QwenConfig(
        family="qwen3_5_moe",
        vocab_size=248_320,
        hidden_size=2048,
        num_layers=40,
        layer_types=_interval_layer_types(40, 4),
        num_heads=16,
        num_kv_heads=2,
        head_dim=256,
        rope_theta=10_000_000.0,
        partial_rotary_factor=0.25,
        mrope_section=(11, 11, 10),
        mrope_interleaved=True,
        rms_norm_eps=1e-6,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        norm_topk_prob=True,
        router_aux_loss_coef=0.001,
        tie_word_embeddings=False,
        max_position_embeddings=262_144,
        eos_token_id=248_044,
        mtp_num_hidden_layers=1,
        dtype="bfloat16",
        param_dtype="float32",
        moe_dispatch="ragged",
        remat="save_dots",
        **extra,
    )


# A few-MB Qwen3.5-MoE (3 DeltaNet + 1 attention layer, 8 experts top-2) for tests and
# the demo; the demo replaces vocab_size with its tokenizer's.
_TINY = QwenConfig(
    family="qwen3_5_moe",
    vocab_size=2048,
    hidden_size=64,
    num_layers=4,
    layer_types=_interval_layer_types(4, 4),
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    rope_theta=10_000_000.0,
    partial_rotary_factor=0.25,
    mrope_section=(2, 1, 1),
    mrope_interleaved=True,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    max_position_embeddings=4096,
    mtp_num_hidden_layers=1,
)


PRESETS: dict[str, QwenConfig] = {
    "tiny": _TINY,
    # Between tiny and the bench config, for miniature experiments on a CPU: two full
    # attention layers (tiny has one) and 2x the width (~2.5x tiny's SFT step time here).
    "small": _TINY.replace(
        hidden_size=128,
        num_layers=8,
        layer_types=_interval_layer_types(8, 4),
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        max_position_embeddings=8192,
    ),
    # tiny with every layer full attention (HF full_attention_interval 1): the miniature that
    # learns to copy from its context, which the agent task is made of (names, ids, handles).
    # bench/bench_copy_learning.py: from random weights, the 3 DeltaNet + 1 attention pattern
    # stays near chance on a copying task for 800 steps where this one copies every token.
    "tiny_attention": _TINY.replace(layer_types=("full_attention",) * 4),
    # The micro live room's policy: tiny with DeltaNet and attention alternating (HF
    # full_attention_interval 2, which SGLang reproduces) and RoPE theta 1e4 instead of
    # Qwen3.5's 1e7, whose rotations are too slow to tell nearby positions apart in a model
    # trained from random weights on rows of 2K tokens. Measured on the copying task
    # (bench/bench_copy_learning.py --rope_theta): alternating layers copy 40% at step 400
    # with theta 1e4 and 6% with 1e7; as shipped (3 DeltaNet + 1 attention) 7% either way.
    "micro": _TINY.replace(layer_types=_interval_layer_types(4, 2), rope_theta=1e4),
    # Qwen3.5-35B-A3B and Qwen3.6-35B-A3B share one architecture (REFERENCE.md section 1).
    "qwen3_5_35b_a3b": _qwen3_5_35b_a3b(),
    "qwen3_6_35b_a3b": _qwen3_5_35b_a3b(),
    "qwen3_30b_a3b": QwenConfig(
        family="qwen3_moe",
        vocab_size=151_936,
        hidden_size=2048,
        num_layers=48,
        layer_types=("full_attention",) * 48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        rope_theta=1_000_000.0,
        partial_rotary_factor=1.0,
        rms_norm_eps=1e-6,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        router_aux_loss_coef=0.001,
        intermediate_size=6144,
        tie_word_embeddings=False,
        max_position_embeddings=40_960,
        bos_token_id=151_643,
        eos_token_id=151_645,
        dtype="bfloat16",
        param_dtype="float32",
        moe_dispatch="ragged",
        remat="save_dots",
    ),
}
