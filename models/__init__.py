"""Qwen MoE policy (Qwen3.5/3.6-MoE and Qwen3-MoE) in Flax NNX. Knows nothing of harnesses or RL.

Public API:
    QwenConfig      frozen config: architecture (HF field names) + runtime choices;
                    `QwenConfig.preset(name)`, `QwenConfig.from_hf(path_or_dict)`,
                    `config.to_hf_dict(layout="text"|"vl")`, `to_dict()` / `from_dict()`.
    PRESETS         name -> QwenConfig: "tiny", "qwen3_5_35b_a3b", "qwen3_6_35b_a3b",
                    "qwen3_30b_a3b".
    Qwen            the decoder, an `nnx.Module`: `Qwen(config, rngs=nnx.Rngs(0))`;
                    `model(input_ids, *, positions=None, segment_ids=None, cache=None)`.
    QwenOutput      `.logits [B,T,V]`, `.hidden [B,T,H]` (after the final norm),
                    `.aux_loss` (load-balancing loss, unscaled), `.cache` (None for now).
    AXIS_NAMES      the logical axis names parameters carry (below).
    chunked_gated_delta_rule, recurrent_gated_delta_rule
                    the segment-aware delta rule (training form and per-step reference).
    dense_experts, sorted_experts, ragged_experts
                    the three dropless MoE dispatches, `f(x, idx, weights, gate_up, down)`
                    with gate_up [E, D, 2, F] (SwiGLU gate then up) and down [E, F, D].

Packed sequences: `segment_ids [B, T]` splits each row into documents; a document is a
maximal run of equal ids and id 0 is padding. Attention is block-diagonal causal, DeltaNet
conv and recurrent state restart at each document start, default positions restart at 0,
and padding is left out of the router statistics. A packed row gives the same outputs as
its documents run one by one.

Logical axis names (`out_sharding` metadata of every `nnx.Param`; mapped to mesh axes only
by `hat_jax.sharding`):
    vocab            vocabulary (embedding rows, LM head columns)
    embed            the residual stream / hidden size
    q_heads, kv_heads, head_dim
                     attention query heads, key/value heads, per-head width
    mlp              expert and shared-expert intermediate width
    expert           routed experts
    layers           the stacked repeats of the layer pattern (leading axis of block params)
    delta_k_heads, delta_v_heads, delta_k_dim, delta_v_dim
                     Gated DeltaNet key/value heads and their widths
    conv_kernel      DeltaNet causal-conv taps
    None             the size-2 axis stacking the SwiGLU gate and up kernels (never sharded)

Layout: parameters of the repeating layer pattern (3 DeltaNet + 1 attention for Qwen3.5,
1 attention for Qwen3-MoE) are stacked over repeats (`blocks/layers/<position>/...`, leading
`layers` axis) and the forward pass scans over them (`config.scan_unroll` repeats per
iteration), each repeat rematerialised per `config.remat`. MoE dispatch per backend:
"sorted" on CPU, "ragged" (`jax.lax.ragged_dot`) on GPU/TPU, "dense" as the reference.
Norms, softmaxes, routing and the delta rule compute in float32 whatever `config.dtype` is.
Parameters are drawn by one jitted draw per model structure (cached), so building a model
again is cheap; under `nnx.eval_shape` nothing is allocated. HF conversion lives in
`serve.convert`; decoding (KV cache, conv/recurrent state), the MTP head and the sampler
come next: the attention and DeltaNet cores already take explicit slots / initial states.
"""

from models._config import PRESETS, QwenConfig
from models._delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule
from models._model import Qwen, QwenOutput
from models._moe import dense_experts, ragged_experts, sorted_experts
from models._params import AXIS_NAMES

__all__ = [
    "AXIS_NAMES",
    "PRESETS",
    "Qwen",
    "QwenConfig",
    "QwenOutput",
    "chunked_gated_delta_rule",
    "dense_experts",
    "ragged_experts",
    "recurrent_gated_delta_rule",
    "sorted_experts",
]
