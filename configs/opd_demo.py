"""General OPD of the demo's tiny HSA-SFT policy toward its pre-SFT base (one CPU machine).

  python -m launch.opd --config=configs/opd_demo.py            # after `launch.sft` (or `make demo`)
  python -m launch.opd --config=configs/opd_demo.py:random     # a random student, for trying it

The student is `runs/demo/sft/checkpoints`. Its base, the teacher, is the model SFT started
from: the demo's SFT starts from the random initialisation of seed 0, which `teacher.kind =
"random"` with `teacher.seed = 0` reproduces exactly (with a real base, `teacher.kind = "hf"`
and its directory). Prompts: the bundled verifiable instructions; the last 16 are held out
for the evaluations (KL to the teacher and instruction pass rates, greedy).
"""

import ml_collections

import configs

ARGS = ("sft", "random")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "sft"
    if variant not in ARGS:
        raise ValueError(f"opd_demo: unknown variant {variant!r}; choose one of {ARGS}")
    c = ml_collections.ConfigDict()
    c.stage = "opd"
    c.run_dir = "runs/demo/opd" if variant == "sft" else "runs/demo/opd_random"
    # The student's architecture comes from its checkpoint; these runtime fields apply to it
    # (and, but for the dtypes in `teacher`, to the teacher). A random model uses the preset.
    c.model = ml_collections.ConfigDict(
        dict(
            preset="tiny",
            vocab_size=0,  # 0: the tokenizer's size rounded up to 128 (random models only)
            dtype="float32",
            param_dtype="float32",
            moe_dispatch="auto",
            remat="none",
        )
    )
    c.policy = ml_collections.ConfigDict(
        dict(kind="orbax", path="runs/demo/sft/checkpoints")
        if variant == "sft"
        else dict(kind="random", path="")
    )
    c.teacher = ml_collections.ConfigDict(
        dict(kind="random", path="", seed=0, dtype="float32", param_dtype="float32")
    )
    c.data = ml_collections.ConfigDict(
        dict(
            instructions="",  # "" = the bundled demo set; or a local Tulu-3 JSONL (`messages`)
            heldout_instructions=16,
            ifeval="",  # a local IFEval JSONL whose prompts must stay out of training
            max_prompt_len=96,
            enable_thinking=False,
            tokenizer_dir="",  # "" = the demo tokenizer (or the policy's HF directory)
            data_shards=0,  # prompt streams (the batch does not depend on the process count)
        )
    )
    c.sampling = ml_collections.ConfigDict(
        dict(
            max_new_tokens=32,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            decode_moe_dispatch="dense",  # per-token decode steps of a tiny CPU model
            sample_chunk=0,  # prompts per sampler call (0: the step's whole batch)
        )
    )
    c.estimator = "exact"  # or "sampled": the sampled-token estimator
    c.logits_chunk = 0
    c.aux_loss_coef = 0.0  # < 0: the model's router_aux_loss_coef
    c.eval = ml_collections.ConfigDict(dict(temperature=0.0, max_prompts=0, samples=4))
    c.trainer = configs.trainer(
        total_steps=30,
        batch_size=8,
        seq_len=128,  # >= max_prompt_len + max_new_tokens
        log_every=5,
        eval_every=15,
        checkpoint_every=15,
        keep_checkpoints=2,
    )
    c.optimizer = configs.optimizer(learning_rate=1e-3, warmup_steps=3, decay_steps=30)
    c.mesh = configs.mesh()
    return c
