"""HSA-SFT of the tiny Qwen3.5-MoE on the demo corpus (one CPU machine, a few minutes).

  python -m launch.sft --config=configs/sft_demo.py          # HSA-SFT
  python -m launch.sft --config=configs/sft_demo.py:fixed    # the Fixed-Harness ablation

The corpus comes from `python -m launch.make_corpus` (`runs/demo/corpus`, or with
`--states original --states_per_scenario 1` for the ablation's `runs/demo/corpus_fixed`).
Demo conversations carry the whole Harness in their prompt (~4.5K tokens with the demo
tokenizer), hence 6K-token rows; a step of 2 rows takes 2-3 s on a 2-core CPU (2.1-2.4 s
measured at the pipeline demo's 5,376-token rows).
"""

import ml_collections

import configs

ARGS = ("hsa", "fixed")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    mode = arg or "hsa"
    if mode not in ARGS:
        raise ValueError(f"sft_demo: unknown variant {mode!r}; choose one of {ARGS}")
    c = ml_collections.ConfigDict()
    c.stage = "sft"
    c.run_dir = "runs/demo/sft" if mode == "hsa" else "runs/demo/sft_fixed"
    c.model = ml_collections.ConfigDict(
        dict(
            preset="tiny",
            # 0: the tokenizer's size rounded up to a multiple of 128.
            vocab_size=0,
            dtype="float32",
            param_dtype="float32",
            # "auto": "capacity" on CPU (batched grid), "ragged" on GPU/TPU; or "dense", "sorted"
            moe_dispatch="auto",
            # "capacity" grid rows per expert, x the mean; rows past it still run (dropless)
            moe_capacity_factor=1.25,
            # True: under a mesh, each device routes only its own tokens (models._moe_sharded)
            moe_shard_local=False,
            # True: under a mesh, each device runs only the experts it stores; tokens travel
            moe_expert_parallel=False,
            # "auto": "flash" (block-wise, O(T) memory, models._flash) on CPU, where it is
            # also faster, "dense" ([T, T] scores) on GPU/TPU; same numbers
            attention_impl="auto",
            attention_block_size=0,  # 0: auto, 256 on CPU, 512 elsewhere
            remat="none",
            # True: also checkpoint each layer inside a block (one layer's activations at a time)
            remat_per_layer=False,
        )
    )
    c.init = ml_collections.ConfigDict(dict(kind="random", path=""))
    c.data = ml_collections.ConfigDict(
        dict(
            harness_mode=mode,
            corpus="runs/demo/corpus" if mode == "hsa" else "runs/demo/corpus_fixed",
            split="train",
            eval_split="dev",
            # > 0: with the eval loss, the teacher-forced tool choice on this many eval records
            # (`hat_jax.eval.tool_choice`: would greedy decoding name the gold tool?), logged
            # as eval/tool_choice*. Under several processes every process runs the same
            # forward passes (the weights span the job) and logs the same figures.
            tool_choice_records=16,
            # > 0: also the in-context copying probe on this many rows of random tokens shown
            # twice (`hat_jax.eval.copy_score`), logged as eval/copy (likewise any process count)
            copy_probe_samples=8,
            online_hsa_probability=0.5 if mode == "hsa" else 0.0,
            online_hsa_dims="all",  # the dimensions online HSA draws from, e.g. "skill_id,hook"
            # The share of online HSA's renames that draw an opaque name (`tool_3f9a`), which
            # the policy can only copy from the Harness it is shown; unset: HSA's default
            # (0.15 x strength, the bank's names for the rest).
            online_hsa_opaque_names=ml_collections.config_dict.placeholder(float),
            # > 0: this share of the original-state records (per epoch) trains bare, without
            # the system prompt and tool schemas: a curriculum for a model with no pretraining
            # (`data.RenderOptions.bare_probability`); the dev split is always whole.
            bare_probability=0.0,
            tokenizer_dir="",
            truncation="drop",
            worker_count=0,
            # Independent record streams; the global batch depends on this, not on the number
            # of processes (which must divide it). 0: gcd(batch_size, 8).
            data_shards=0,
        )
    )
    c.trainer = configs.trainer(
        total_steps=24, batch_size=2, seq_len=6144, log_every=2, eval_every=12,
        checkpoint_every=12,
    )  # fmt: skip
    c.optimizer = configs.optimizer(
        learning_rate=3e-3, warmup_steps=3, decay_steps=24, weight_decay=0.1
    )
    c.mesh = configs.mesh()
    # < 0: the model's own router_aux_loss_coef.
    c.aux_loss_coef = -1.0
    # > 0: the loss is computed this many positions at a time (no [B, T, V] logits).
    c.logits_chunk = 0
    return c
