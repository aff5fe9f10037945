"""HSA-SFT of Qwen3.6-35B-A3B from its Hugging Face checkpoint (production; accelerators).

  python -m launch.sft --config=configs/sft_qwen3_6_35b_a3b.py \
      --config.init.path=/ckpt/Qwen3.6-35B-A3B --config.data.corpus=/data/hat/corpus
  python -m launch.sft --config=configs/sft_qwen3_6_35b_a3b.py:fixed ...   # the ablation

Full fine-tuning with fp32 master weights and AdamW state, bf16 compute, layers rematerialised,
experts through `ragged_dot` and expert-parallel (each device runs the experts it stores, on
the tokens of every device); the mesh is FSDP over every device by default. The memory plan
(`python -m launch.plan --config=configs/sft_qwen3_6_35b_a3b.py`) fits this on 16 x 80 GB;
on 8 x 96 GB the fp32 state alone (48 GiB per device) leaves too little, so keep parameters
and moments in bf16 there: `--config.model.param_dtype=bfloat16`.
10K trajectories packed into 8K-token rows: ~150 steps per epoch at 32 rows.
"""

import ml_collections

from configs import sft_demo

ARGS = ("hsa", "fixed")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    mode = arg or "hsa"
    c = sft_demo.get_config(mode)
    c.run_dir = f"runs/sft_qwen3_6_35b_a3b_{mode}"
    c.model.preset = "qwen3_6_35b_a3b"
    c.model.vocab_size = -1  # -1: keep the checkpoint's vocabulary
    c.model.dtype = "bfloat16"
    c.model.param_dtype = "float32"
    c.model.moe_dispatch = "ragged"
    c.model.moe_expert_parallel = True  # experts computed where stored; tokens all-gathered
    c.model.attention_impl = "flash"  # no [T, T] scores in the full-attention layers
    c.model.attention_block_size = 512
    c.model.remat = "full"
    c.model.remat_per_layer = False  # True raised the planned temporaries (59 -> 67 GiB)
    c.init.kind = "hf"
    c.init.path = ""  # required: the local Hugging Face checkpoint directory
    c.data.corpus = ""  # required: the teacher corpus directory
    c.data.online_hsa_probability = 0.3 if mode == "hsa" else 0.0
    c.data.worker_count = 4
    # off here (score checkpoints with launch.tool_choice, which prints copying too); when set
    # they run on any number of processes, every process on the same rows
    c.data.tool_choice_records = 0
    c.data.copy_probe_samples = 0
    c.trainer.total_steps = 300
    c.trainer.batch_size = 32
    c.trainer.seq_len = 8192
    c.trainer.log_every = 1
    c.trainer.eval_every = 50
    c.trainer.checkpoint_every = 50
    c.optimizer.learning_rate = 1e-5
    c.optimizer.warmup_steps = 15
    c.optimizer.decay_steps = 300
    c.optimizer.weight_decay = 0.1
    c.mesh.fsdp = -1
    c.logits_chunk = 1024  # [1024, 248K] float32 logits per step of the loss scan, not [8K, 248K]
    return c
