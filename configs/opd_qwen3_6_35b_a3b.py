"""General OPD of an HSA-SFT Qwen3.6-35B-A3B toward its base (production; accelerators).

  python -m launch.opd --config=configs/opd_qwen3_6_35b_a3b.py \
      --config.policy.path=/runs/sft_qwen3_6_35b_a3b_hsa/checkpoints \
      --config.teacher.path=/ckpt/Qwen3.6-35B-A3B \
      --config.data.instructions=/data/tulu3_prompts.jsonl --config.data.ifeval=/data/ifeval.jsonl

The student trains in float32 master weights with bfloat16 compute; the teacher (the base HF
checkpoint) sits on the same mesh, inference only, in bfloat16. Prompts are a local Tulu-3
JSONL (a `messages` list per line); the IFEval prompts in `data.ifeval` are refused if any
appear in it. Both models compute their logits 1K positions at a time (no [T, 248K] logits).

The memory plan (`python -m launch.plan --config=configs/opd_qwen3_6_35b_a3b.py
--setups=8x96,16x80 --layouts=fsdp,fsdp_bf16`; per device, train step / sampling phase):
16 x 80 GB fits with float32 master weights (56 / 47 GiB); 8 x 96 GB does not (100 GiB for
the step: 57 GiB of state, the bf16 teacher included), so there keep the student's
parameters and moments in bfloat16 (`--config.model.param_dtype=bfloat16`: 69 / 52 GiB).
"""

import ml_collections

from configs import opd_demo

ARGS = (None,)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = opd_demo.get_config("sft")
    c.run_dir = "runs/opd_qwen3_6_35b_a3b"
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
    c.policy.path = ""  # required: the HSA-SFT checkpoint
    c.teacher.kind = "hf"
    c.teacher.path = ""  # required: the base model's Hugging Face directory
    c.teacher.dtype = "bfloat16"
    c.teacher.param_dtype = "bfloat16"
    c.data.instructions = ""  # required: a local Tulu-3 JSONL of chat prompts
    c.data.heldout_instructions = 256
    c.data.max_prompt_len = 2048
    c.data.enable_thinking = True
    c.sampling.max_new_tokens = 2048
    c.sampling.top_p = 1.0
    c.sampling.decode_moe_dispatch = ""  # the model's ragged dispatch
    # 64 prompts x 4K tokens of caches at once do not fit beside the train state on 8 x 96 GB
    # (launch.plan): sample 16 at a time.
    c.sampling.sample_chunk = 16
    c.logits_chunk = 1024
    c.aux_loss_coef = -1.0
    c.eval.max_prompts = 256
    c.trainer.total_steps = 200
    c.trainer.batch_size = 64
    c.trainer.seq_len = 4096  # max_prompt_len + max_new_tokens
    c.trainer.log_every = 1
    c.trainer.eval_every = 50
    c.trainer.checkpoint_every = 50
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 10
    c.optimizer.decay_steps = 200
    c.mesh.fsdp = -1
    return c
