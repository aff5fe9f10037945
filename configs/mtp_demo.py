"""MTP draft-head adaptation of the demo's tiny policy (one CPU machine, a few minutes).

  python -m launch.mtp --config=configs/mtp_demo.py           # the demo's HSA-SFT policy
  python -m launch.mtp --config=configs/mtp_demo.py:random    # a fresh random tiny policy

The default variant starts from `runs/demo/sft/checkpoints` (`python -m launch.sft
--config=configs/sft_demo.py`, or `make demo`); `:random` needs nothing but is a random
policy, for trying the stage out. The tiny demo has no base checkpoint with `mtp.*` tensors,
so the head starts from random initialisation (explicitly: `head.kind = "random"`); with a
real base model set `head.kind = "hf"` and `head.path` to it. Rollouts: the policy answers
the bundled instruction prompts at temperature 1; the last 16 instructions are held out for
the before/after figures.
"""

import ml_collections

import configs

ARGS = ("sft", "random")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "sft"
    if variant not in ARGS:
        raise ValueError(f"mtp_demo: unknown variant {variant!r}; choose one of {ARGS}")
    c = ml_collections.ConfigDict()
    c.stage = "mtp"
    c.run_dir = "runs/demo/mtp" if variant == "sft" else "runs/demo/mtp_random"
    # Used for a random policy; a checkpoint's own model_config.json wins otherwise (only
    # the runtime fields below apply to it).
    c.model = ml_collections.ConfigDict(
        dict(
            preset="tiny",
            # 0: the tokenizer's size rounded up to 128; -1: the preset's.
            vocab_size=0,
            dtype="float32",
            param_dtype="float32",
            moe_dispatch="auto",
            remat="none",
        )  # fmt: skip
    )
    c.policy = ml_collections.ConfigDict(
        dict(kind="orbax", path="runs/demo/sft/checkpoints")
        if variant == "sft"
        else dict(kind="random", path="")
    )
    c.head = ml_collections.ConfigDict(dict(kind="random", path=""))
    c.data = ml_collections.ConfigDict(
        dict(
            # "instructions": general instruction prompts; "corpus": the agent prompts (Harness
            # system prompt, tools, history) of a teacher corpus's `split` / `eval_split`.
            source="instructions",
            instructions="",  # "" = the bundled demo set; or a local Tulu3-format JSONL
            corpus="",
            split="train",
            eval_split="dev",
            corpus_seq_len=8192,  # pipeline rows the prompts are cut from
            heldout_instructions=16,
            max_prompt_len=128,
            enable_thinking=True,
            tokenizer_dir="",  # "" = the demo tokenizer
        )
    )
    c.rollout = ml_collections.ConfigDict(
        dict(
            batch_size=8,
            batches=12,
            eval_batches=2,
            max_new_tokens=64,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            seed=0,
            # per-token decode steps of the tiny CPU model: dense MoE is fastest
            decode_moe_dispatch="dense",
        )
    )
    c.trainer = configs.trainer(
        total_steps=60,
        batch_size=8,
        seq_len=192,  # >= max_prompt_len + max_new_tokens
        eval_every=20,
        checkpoint_every=30,
        keep_checkpoints=2,
    )
    c.optimizer = configs.optimizer(learning_rate=3e-3, warmup_steps=5, decay_steps=60)
    c.mesh = configs.mesh()
    c.num_draft_tokens = 3  # k of the simulated acceptance length (SGLang's num-steps)
    c.aux_loss_coef = 0.0  # < 0: the model's router_aux_loss_coef
    c.measure_speculative = True  # also decode speculatively with the head, before and after
    c.export = ml_collections.ConfigDict(
        dict(
            hf_dir="runs/demo/mtp/hf" if variant == "sft" else "runs/demo/mtp_random/hf",
            dtype="float32",
        )  # fmt: skip
    )
    return c
