"""The demo's base: the tiny Qwen3.5-MoE trained from random weights on general verifiable
instructions, so the HAT stages start from a model with general ability to lose (one CPU).

  python -m launch.make_general --out runs/demo/base/corpus --train 4000 --dev 200
  python -m launch.sft --config=configs/base_demo.py

It is `launch.sft` with `harness_mode="general"`: records are `{"messages": [user, assistant]}`
answers written by `data._general` (short, so many pack into one row). The pipeline's `base`
stage writes the corpus (`general`: its sizes and seed) and trains this; HSA-SFT then starts
from the base and General OPD distils toward it.
"""

import ml_collections

from configs import sft_demo

ARGS = (None,)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"base_demo: takes no variant, got {arg!r}")
    c = sft_demo.get_config("hsa")
    c.run_dir = "runs/demo/base"
    # The corpus `launch.make_general` (or the pipeline's base stage) writes.
    # lookup_share: that share of the records are in-context lookup items (`data._lookup`:
    # answers copied from the prompt, the skill the agent task is made of).
    c.general = ml_collections.ConfigDict(dict(train=4000, dev=200, seed=0, lookup_share=0.0))
    # lookup_eval_records > 0 (with general.lookup_share > 0): the teacher-forced answers of
    # that many of the dev split's lookup items at each evaluation (eval/lookup*)
    c.data.update(dict(harness_mode="general", corpus="runs/demo/base/corpus",
                       online_hsa_probability=0.0, tool_choice_records=0,
                       lookup_eval_records=0))  # fmt: skip
    # 120 steps of 8 rows x 1,024 tokens (about 40 answers per step; ~1 s a step on two CPU
    # cores). Measured at 150 steps: general set (40 items, thinking on) prompt-strict 22.5,
    # instruction-strict 48.8, against 10.0 / 17.7 for on-topic answers that ignore every
    # instruction and 0.0 / 1.2 for the random initialisation.
    c.trainer.update(dict(total_steps=120, batch_size=8, seq_len=1024, log_every=10,
                          eval_every=40, checkpoint_every=40))  # fmt: skip
    c.optimizer.update(dict(learning_rate=3e-3, warmup_steps=10, decay_steps=120))
    return c
