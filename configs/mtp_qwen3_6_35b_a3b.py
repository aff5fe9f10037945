"""MTP draft-head adaptation of a trained Qwen3.6-35B-A3B policy (production; accelerators).

  python -m launch.mtp --config=configs/mtp_qwen3_6_35b_a3b.py \
      --config.policy.path=/runs/hsa_rl/checkpoints \
      --config.head.path=/ckpt/Qwen3.6-35B-A3B --config.data.corpus=/data/hat/corpus

The head is grafted from the base model's `mtp.*` tensors (checked against the policy's
shapes) and adapted to the policy's own outputs; the policy stays frozen (bf16 compute,
parameters only in the step's state, no optimiser state for it). The tokenizer is read from
`data.tokenizer_dir`, else from the base checkpoint in `head.path`. Exported for SGLang with
the 19 `mtp.*` tensors (`--speculative-algorithm NEXTN`).
"""

import ml_collections

from configs import mtp_demo

ARGS = (None,)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = mtp_demo.get_config("sft")
    c.run_dir = "runs/mtp_qwen3_6_35b_a3b"
    c.model.preset = "qwen3_6_35b_a3b"
    c.model.vocab_size = -1  # -1: the preset's (a checkpoint's own config always wins)
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.moe_dispatch = "ragged"
    c.model.remat = "full"
    c.policy.kind = "orbax"
    c.policy.path = ""  # required: the trained policy's checkpoint (e.g. the HSA-RL run)
    c.head.kind = "hf"
    c.head.path = ""  # required: the base HF checkpoint whose mtp.* head is grafted
    # The head drafts for agent traffic: prompts are the agent turns of the teacher corpus
    # (Harness system prompt, tools, history); `source="instructions"` with a Tulu3 JSONL in
    # `data.instructions` uses general instructions instead.
    c.data.source = "corpus"
    c.data.corpus = ""  # required: the teacher corpus (train / dev splits)
    c.data.corpus_seq_len = 16384
    c.data.max_prompt_len = 8192
    c.rollout.batch_size = 64
    c.rollout.batches = 64  # 4096 rollouts
    c.rollout.eval_batches = 4
    c.rollout.max_new_tokens = 1024
    c.rollout.temperature = 1.0
    c.rollout.top_p = 0.95
    c.rollout.decode_moe_dispatch = ""  # the model's ragged dispatch
    c.trainer.total_steps = 500
    c.trainer.batch_size = 32
    c.trainer.seq_len = 9216  # max_prompt_len + max_new_tokens
    c.trainer.log_every = 1
    c.trainer.eval_every = 100
    c.trainer.checkpoint_every = 100
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = 20
    c.optimizer.decay_steps = 500
    c.mesh.fsdp = -1
    c.aux_loss_coef = -1.0  # the model's router_aux_loss_coef
    c.export.hf_dir = "runs/mtp_qwen3_6_35b_a3b/hf"
    c.export.dtype = "bfloat16"
    return c
