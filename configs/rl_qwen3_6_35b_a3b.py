"""HSA-RL of Qwen3.6-35B-A3B from its HSA-SFT + General-OPD checkpoint (production).

  python -m launch.rl --config=configs/rl_qwen3_6_35b_a3b.py \
      --config.policy.path=/runs/opd_qwen3_6_35b_a3b/checkpoints
  python -m launch.rl --config=configs/rl_qwen3_6_35b_a3b.py:agentic ...   # the ablation

GRPO groups of 8 episodes over 32 scenarios per rollout, GSPO with the paper's clip range
(3e-4 / 4e-4) and no KL term, the CoT-length term at λ = 0.1 (thresholds 100 / 200 tokens),
two minibatch passes per rollout. Episodes keep the serving limits (4 rounds, 10 s, 5 s per
tool call) only when the rollout decodes as fast as serving does: on a training cluster the
budgets stay out of the way and each call gets a token budget. Log-probs are computed 1K
positions at a time (no [12K, 248K] logits); the sampler takes 8 episodes per call.

The memory plan (`python -m launch.plan --config=configs/rl_qwen3_6_35b_a3b.py
--setups=8x96,16x80,32x80 --layouts=fsdp,fsdp_bf16`; per device, train step / sampling
phase): float32 master weights fit on 32 x 80 GB (56 / 46 GiB) but not on 16 x 80 GB (72 GiB
for the step) or 8 x 96 GB (111 GiB); parameters and moments in bfloat16
(`--config.model.param_dtype=bfloat16`) fit on 8 x 96 GB (79 / 58 GiB) and 16 x 80 GB
(56 / 46 GiB), at the cost that updates below bfloat16's resolution of a weight (about 1/256
of it; at this learning rate, most of them) are rounded away.
"""

import ml_collections

from configs import rl_demo

ARGS = ("hsa", "agentic")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "hsa"
    c = rl_demo.get_config(variant)
    c.run_dir = f"runs/rl_qwen3_6_35b_a3b_{variant}"
    c.model.preset = "qwen3_6_35b_a3b"
    c.model.vocab_size = -1
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.moe_dispatch = "ragged"
    c.model.moe_expert_parallel = True
    c.model.attention_impl = "flash"
    c.model.attention_block_size = 512
    c.model.remat = "full"
    c.policy.kind = "orbax"
    c.policy.path = ""  # required: the HSA-SFT + General-OPD checkpoint
    c.rollout.scenarios = 32
    c.rollout.group_size = 8
    c.rollout.epochs = 2
    c.rollout.max_tokens = 1024
    c.rollout.decode_moe_dispatch = ""  # the model's ragged dispatch
    c.rollout.sample_chunk = 8  # episodes per sampler call (prefill + caches beside the state)
    c.eval.scenarios = 64
    c.trainer.total_steps = 400
    c.trainer.batch_size = 64
    c.trainer.seq_len = 12288  # Harness prompt + history + up to 4 rounds of calls
    c.trainer.log_every = 1
    c.trainer.eval_every = 50
    c.trainer.checkpoint_every = 50
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 10
    c.optimizer.decay_steps = 400
    c.aux_loss_coef = -1.0
    c.logits_chunk = 1024  # [1024, 248K] logits per step of the log-prob scan, not [12K, 248K]
    c.mesh.fsdp = -1
    return c
