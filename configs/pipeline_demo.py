"""The whole HAT pipeline on the tiny demo model, as one resumable run (one CPU machine).

  make demo  =  python -m launch.pipeline --config=configs/pipeline_demo.py [--workdir runs/demo]

Stages, in order: `base` (general verifiable instructions: the model HAT starts from),
`corpus` (the scripted teacher's quality-filtered corpus), `sft` (HSA-SFT from the base),
`opd` (General OPD toward the base), `rl` (HSA-RL), `mtp` (draft-head adaptation),
`export` (the final policy with its adapted head as a Hugging Face directory) and `eval` (the
export on the evaluation sets). Each stage's own block is that stage's demo config
(`configs/<stage>_demo.py`); the pipeline points each stage's input at the previous stage's
output under `workdir` and its run directory at `<workdir>/<stage>`, so the paths in these
blocks are only used by stages the pipeline does not run (`stages`). The ablation arms
(`configs/ablations.py`) are this config with the arm's differences.
"""

import ml_collections

from configs import base_demo, eval_demo, mtp_demo, opd_demo, rl_demo, sft_demo

ARGS = (None,)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"pipeline_demo: takes no variant, got {arg!r}")
    c = ml_collections.ConfigDict()
    c.stage = "pipeline"
    c.workdir = "runs/demo"
    # The stages this run holds, in pipeline order (a subset skips the others: a stage's
    # input is then its own block's path).
    c.stages = "base,corpus,sft,opd,rl,mtp,export,eval"
    # The bundled live room of every stage (`hat_jax.livestream.room`; the corpus, RL's
    # simulator and the evaluation sets follow it): "v0", Harness v0, or "micro", the compact
    # Harness with a composed comment language (give it its own `eval.sets_dir`, and the
    # `micro` model preset to the base). The demo stays on v0 until a micro policy learns the
    # task in its budget: measured, a tiny policy from random weights does not yet read the
    # comment behind the micro Harness's 1.3K tokens of prompt in 300 SFT steps (README).
    c.room = "v0"
    # The base: the tiny model trained from random weights on general verifiable instructions
    # (`configs/base_demo.py`), then scored on these evaluation sets (the final evaluation
    # compares itself with it, item by item). HSA-SFT starts from it; OPD distils toward it.
    c.base = base_demo.get_config()
    # 100 steps (the base config's own: 120), two evaluations with a small copying probe
    c.base.trainer.update(dict(total_steps=100, eval_every=50, checkpoint_every=50))
    c.base.optimizer.decay_steps = 100
    c.base.data.copy_probe_samples = 4
    c.base_eval_sets = "general"
    c.corpus = ml_collections.ConfigDict(
        dict(
            # training scenarios (a seeded sample of the train split): SFT sees each episode
            # about once (56 steps x 2 rows), so it learns the format, not one scenario
            num_scenarios=100,
            dev_scenarios=8,  # dev scenarios, for SFT's eval split (0: no dev split)
            states_per_scenario=2,
            # "original+augmented" (HSA-SFT) or "original" (the Fixed-Harness ablation)
            states="original+augmented",
            hsa_dims="all",
            hsa_strength=0.5,
            num_shards=2,
            seed=0,
        )
    )
    # Each stage's own demo config, resized for two CPU cores (11.5 minutes measured on
    # 2026-12-04 against a 15-minute target): SFT from the base long enough to learn the
    # agent's output format (dev loss 2.5 at step 52; the tiny model does not learn the task
    # itself in this budget: the report's evaluation says so), OPD back toward the base, two
    # small RL updates, MTP on the agent's own prompts.
    c.sft = sft_demo.get_config("hsa")
    # Rows of 5,376 tokens: a demo conversation renders to 3.8K-5.2K tokens (the Harness is in
    # its prompt), one to a row, so 6K rows were a quarter padding.
    c.sft.trainer.update(dict(total_steps=52, seq_len=5376, log_every=4, eval_every=26,
                              checkpoint_every=26))  # fmt: skip
    c.sft.optimizer.update(dict(warmup_steps=6, decay_steps=52))
    c.sft.data.update(dict(tool_choice_records=8, copy_probe_samples=4))
    c.opd = opd_demo.get_config("sft")
    c.rl = rl_demo.get_config("hsa")
    c.rl.rollout.scenarios = 1  # x group_size 4 = 4 episodes per update
    c.rl.eval.update(dict(scenarios=2, trajectories=2))
    c.rl.trainer.update(dict(total_steps=2, batch_size=4, eval_every=2, checkpoint_every=2))
    c.rl.optimizer.decay_steps = 2
    c.mtp = mtp_demo.get_config("sft")
    # The draft head learns the policy's own traffic: the agent prompts of the corpus (the
    # pipeline points `data.corpus` at its corpus stage), first turns of up to 4.5K tokens.
    c.mtp.data.update(dict(source="corpus", max_prompt_len=4608))
    c.mtp.rollout.update(dict(batch_size=4, batches=3, eval_batches=2, max_new_tokens=64))
    c.mtp.trainer.update(dict(total_steps=6, batch_size=4, seq_len=4672, eval_every=3,
                              checkpoint_every=3))  # fmt: skip
    c.mtp.optimizer.update(dict(warmup_steps=1, decay_steps=6))
    c.export = ml_collections.ConfigDict(
        dict(
            dtype="float32",
            tokenizer_dir="",
            # transformers reloads the export; its logits on a rendered chat must match ours
            check_transformers=True,
            max_logit_diff=1e-4,
        )
    )
    c.eval = eval_demo.get_config("hf")
    # Smaller sets than the standalone evaluation's, so in their own directory (a set
    # directory holds one version of each set).
    c.eval.sets_dir = "runs/eval/sets_demo"
    c.eval.sizes.update(dict(t1=8, t2=8, t3_tool=4, t3_prompt=4, general=12))
    return c
