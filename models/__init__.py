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
                    `.aux_loss` (load-balancing loss, unscaled), `.cache` (cached calls).
    Cache, init_cache
                    decoding state (KV cache of attention layers, conv + recurrent state of
                    DeltaNet layers): `model.init_cache(batch, max_length, rollback=0)`;
                    `model(ids, segment_ids=..., cache=cache)` continues each row (left- or
                    right-padded prompts); `cache.rewind(n)` takes back the newest tokens.
                    `cache_logical_axes(cache)` names its axes for sharding rules.
    MTPHead, MTPOutput, check_mtp_config
                    the NextN draft head (SGLang's convention; shares the target's
                    embedding and LM head): `head(hidden, next_input_ids, target, ...)`;
                    `MTPHead(policy_config, rngs=...)` (Qwen3.5 family only). HF form: the
                    19 `mtp.*` tensors, `serve.convert.load_mtp(hf_dir, config=...)` /
                    `save_hf(..., mtp=head)`; trained on policy rollouts by `rl.run_mtp`.
    Sampler, Sampling, SampleOutput
                    batched generation (greedy / temperature / top-k / top-p, stop tokens,
                    per-row limits, bucketed shapes capped at `max_length`, optional
                    self-speculative decoding with an MTPHead):
                    `Sampler(model)(prompts, max_new_tokens=, sampling=) -> SampleOutput`
                    (tokens, log-probs under the sampling distribution and under the
                    unmodified policy; `rows()` with the sampled-vs-forced mask).
    Strategy, Standard, SamplingArrays, GREEDY, speculative_accept
                    sampling strategies (logits and per-row `SamplingArrays` -> sampling
                    log-probs) and exact speculative acceptance.
    AXIS_NAMES      the logical axis names parameters carry (below).
    chunked_gated_delta_rule, recurrent_gated_delta_rule
                    the segment-aware delta rule (training form and per-step reference).
    dense_experts, sorted_experts, capacity_experts, ragged_experts
                    the four dropless MoE dispatches, `f(x, idx, weights, gate_up, down)`
                    with gate_up [E, D, 2, F] (SwiGLU gate then up) and down [E, F, D];
                    `expert_capacity` is the grid size of "capacity".
    gathered_experts
                    the "sorted" block loop without [N K, D] row buffers (rows gathered
                    block by block); used by the expert-parallel dispatch.
    shard_local_experts
                    a dispatch run per shard of the tokens under a mesh (each device sorts
                    only its own tokens; `config.moe_shard_local`).
    expert_parallel_experts
                    a dispatch run where the experts are stored: tokens gathered over the
                    expert group, outputs reduce-scattered (`config.moe_expert_parallel`).
    flash_attention block-wise causal, document-masked attention with online softmax and a
                    recomputing backward pass: O(T) memory (`config.attention_impl="flash"`).

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
iteration), each repeat rematerialised per `config.remat`. MoE dispatch: "auto" by default,
i.e. "capacity" on CPU and "ragged" (`jax.lax.ragged_dot`) on GPU/TPU (`QwenConfig.resolved`,
applied when a model is built); "sorted" and "dense" (the reference) on request.
Norms, softmaxes, routing and the delta rule compute in float32 whatever `config.dtype` is.
Parameters are drawn by one jitted draw per model structure (cached), so building a model
again is cheap; under `nnx.eval_shape` nothing is allocated. HF conversion (the `mtp.*`
tensors of the draft head included) lives in `serve.convert`.
"""

from models._cache import Cache, cache_logical_axes, init_cache
from models._config import PRESETS, QwenConfig
from models._delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule
from models._flash import flash_attention
from models._model import Qwen, QwenOutput
from models._moe import (
    capacity_experts,
    dense_experts,
    expert_capacity,
    gathered_experts,
    ragged_experts,
    sorted_experts,
)
from models._moe_sharded import expert_parallel_experts, shard_local_experts
from models._mtp import MTPHead, MTPOutput, check_mtp_config
from models._params import AXIS_NAMES
from models._sampler import SampleOutput, Sampler, shared_prefix_length
from models._sampling import (
    GREEDY,
    Sampling,
    SamplingArrays,
    Standard,
    Strategy,
    speculative_accept,
)

__all__ = [
    "AXIS_NAMES",
    "GREEDY",
    "PRESETS",
    "Cache",
    "MTPHead",
    "MTPOutput",
    "Qwen",
    "QwenConfig",
    "QwenOutput",
    "SampleOutput",
    "Sampler",
    "shared_prefix_length",
    "Sampling",
    "SamplingArrays",
    "Standard",
    "Strategy",
    "cache_logical_axes",
    "check_mtp_config",
    "chunked_gated_delta_rule",
    "capacity_experts",
    "dense_experts",
    "expert_capacity",
    "flash_attention",
    "expert_parallel_experts",
    "gathered_experts",
    "ragged_experts",
    "init_cache",
    "recurrent_gated_delta_rule",
    "shard_local_experts",
    "sorted_experts",
    "speculative_accept",
]
