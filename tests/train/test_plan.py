"""Memory plans: compiled on simulated devices, nothing allocated, numbers that add up."""

import jax
import pytest
from flax import nnx

import models
from hat_jax.sharding import MeshConfig
from hat_jax.train import GIB, SFTConfig, TrainerConfig, plan_sft_step


@pytest.mark.slow
def test_plan_of_the_tiny_model_scales_with_the_mesh():
    config = models.QwenConfig.preset("tiny")
    model_fn = lambda: models.Qwen(config, rngs=nnx.Rngs(0))  # noqa: E731
    plans = {}
    for fsdp in (2, 8):
        sft = SFTConfig(
            trainer=TrainerConfig(total_steps=1, batch_size=8, seq_len=256, micro_batches=2),
            mesh=MeshConfig(fsdp=fsdp),
            logits_chunk=64,
        )
        plans[fsdp] = plan_sft_step(sft, model_fn, devices=jax.devices()[:fsdp])
    two, eight = plans[2], plans[8]
    assert two.params == eight.params > 1e5
    # params + AdamW moments in float32, sharded: about 12 bytes per parameter per shard count
    assert 0.9 < two.state_bytes / (12 * two.params / 2) < 1.2
    assert eight.state_bytes < two.state_bytes / 3
    assert two.aliased > 0.9 * two.state_bytes, "the donated state is updated in place"
    assert two.peak >= two.arguments and two.temporaries > 0
    assert two.fits(80e9) and not two.fits(two.peak * 1.05, reserve=0.1)
    assert two.largest and two.largest[0][1] >= two.largest[-1][1]
    assert two.mesh == {"data": 1, "fsdp": 2, "expert": 1, "tensor": 1} and GIB == 2**30
