"""Qwen MoE policy (Qwen3.5/3.6-MoE and Qwen3-MoE) in Flax NNX. Knows nothing of harnesses or RL.

    from flax import nnx
    import models
    config = models.QwenConfig.preset("tiny")
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    logits = model(input_ids, segment_ids=segment_ids).logits          # [B, T, V]
    out = models.Sampler(model)(prompts, max_new_tokens=64, sampling=models.Sampling(temperature=0.7))

Public names: `QwenConfig` / `PRESETS` (architecture in HF field names plus runtime choices,
resolved per backend when a model is built), `Qwen` / `QwenOutput`, `Cache` / `init_cache` /
`cache_logical_axes` (decoding state), `MTPHead` / `MTPOutput` / `check_mtp_config` (the
NextN draft head; trained by `rl.mtp`, converted by `serve.convert`), `Sampler` / `Sampling` /
`SampleOutput` / `Strategy` / `Standard` / `SamplingArrays` / `GREEDY` / `speculative_accept` /
`shared_prefix_length` / `combine_acceptance`
(generation, with optional self-speculative decoding), `AXIS_NAMES` (the logical axis names
parameters carry; mapped to mesh axes only by `hat_jax.sharding`), and the kernels: the delta
rule (`chunked_gated_delta_rule`, `recurrent_gated_delta_rule`), the MoE dispatches
(`dense_experts`, `sorted_experts`, `capacity_experts`, `ragged_experts`, `gathered_experts`,
`shard_local_experts`, `expert_parallel_experts`, `expert_capacity`) and `flash_attention`.
Packed rows (`segment_ids`, 0 = padding), the stacked layer layout and the dispatch choices are
described in WORKSPACE.md ("Decisions taken").
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
from models._sampler import SampleOutput, Sampler, combine_acceptance, shared_prefix_length
from models._sampling import (
    GREEDY,
    Sampling,
    SamplingArrays,
    Standard,
    Strategy,
    speculative_accept,
)
from models._slots import SlotDecoder, StepOutput

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
    "SlotDecoder",
    "StepOutput",
    "shared_prefix_length",
    "Sampling",
    "SamplingArrays",
    "Standard",
    "Strategy",
    "cache_logical_axes",
    "combine_acceptance",
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
