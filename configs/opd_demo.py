"""General OPD of the demo's tiny HSA-SFT policy toward its base (one CPU machine).

  python -m launch.opd --config=configs/opd_demo.py            # after `make demo`
  python -m launch.opd --config=configs/opd_demo.py:random     # a random student, for trying it

The student is `runs/demo/sft/checkpoints`; its teacher, the base SFT started from:
`runs/demo/base/checkpoints`, the tiny model trained on general verifiable instructions by the
pipeline's base stage (`configs/base_demo.py`; with a released base, `teacher.kind = "hf"`
and its directory). Prompts: the bundled verifiable instructions; the last 16 are held out for
the evaluations (KL to the teacher and instruction pass rates, greedy).

Thinking on, as the demo's policies answer and are evaluated. Measured from an 80-step
HSA-SFT policy of the demo (general set, 16 items, thinking on, prompt-strict: base 31.2, SFT
0.0), 30 OPD steps: thinking off, learning rate 1e-3: general set 0.0 (OPD's own held-out
prompts, scored without thinking: 0.0 -> 0.375); thinking on, 1e-3: 25.0 (held-out 0.0 ->
0.5), but the agent's first reasoning line (dev episodes, teacher-forced) rose from 1.92 to
4.88 nats per token; 3e-4: 0.0 (3.11 nats); 1e-4: 12.5 (2.13 nats), and from the 64-step
SFT policy 1e-4 recovered nothing (held-out 0.0 -> 0.0). In a model this small general
instructions and the agent compete for the same weights; 1e-3 is kept so that OPD visibly
does its job, and the cost to the agent is the figure above.
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
        dict(
            kind="orbax",
            path="runs/demo/base/checkpoints",
            seed=0,
            dtype="float32",
            param_dtype="float32",
        )  # fmt: skip
        if variant == "sft"  # `:random`: a random teacher (seed 0) too, to need no file
        else dict(kind="random", path="", seed=0, dtype="float32", param_dtype="float32")
    )
    c.data = ml_collections.ConfigDict(
        dict(
            instructions="",  # "" = the bundled demo set; or a local Tulu-3 JSONL (`messages`)
            heldout_instructions=16,
            ifeval="",  # a local IFEval JSONL whose prompts must stay out of training
            max_prompt_len=96,
            enable_thinking=True,
            tokenizer_dir="",  # "" = the demo tokenizer (or the policy's HF directory)
            data_shards=0,  # prompt streams (the batch does not depend on the process count)
        )
    )
    c.sampling = ml_collections.ConfigDict(
        dict(
            max_new_tokens=96,  # the base's plan line and a short answer
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            decode_moe_dispatch="dense",  # per-token decode steps of a tiny CPU model
            sample_chunk=0,  # prompts per sampler call (0: the step's whole batch)
            # > 0: self-speculative sampling, this many MTP drafts verified per step (the same
            # distribution as plain sampling); the head: an MTP stage's `<run>/head` or an HF
            # checkpoint with mtp.* tensors (default: the policy's own, if HF and it has them).
            num_draft_tokens=0,
            draft_head="",
        )
    )
    c.estimator = "exact"  # or "sampled": the sampled-token estimator
    c.logits_chunk = 0
    c.aux_loss_coef = 0.0  # < 0: the model's router_aux_loss_coef
    c.eval = ml_collections.ConfigDict(dict(temperature=0.0, max_prompts=0, samples=4))
    c.trainer = configs.trainer(
        total_steps=30,
        batch_size=8,
        seq_len=192,  # >= max_prompt_len + max_new_tokens
        log_every=5,
        eval_every=15,
        checkpoint_every=15,
        keep_checkpoints=2,
    )
    c.optimizer = configs.optimizer(learning_rate=1e-3, warmup_steps=3, decay_steps=30)
    c.mesh = configs.mesh()
    return c
