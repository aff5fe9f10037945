"""The whole HAT pipeline on the tiny demo model, as one resumable run (one CPU machine).

  python -m launch.pipeline --config=configs/pipeline_demo.py [--workdir runs/pipeline]

Stages, in order: `corpus` (the scripted teacher's quality-filtered corpus), `sft` (HSA-SFT),
`opd` (General OPD toward the pre-SFT base), `rl` (HSA-RL), `mtp` (draft-head adaptation),
`export` (the final policy with its adapted head as a Hugging Face directory) and `eval` (the
export on the evaluation sets). Each stage's own block is that stage's demo config
(`configs/<stage>_demo.py`); the pipeline points each stage's input at the previous stage's
output under `workdir` and its run directory at `<workdir>/<stage>`, so the paths in these
blocks are only used by stages the pipeline does not run (`stages`). The ablation arms
(`configs/ablations.py`) are this config with the arm's differences.
"""

import ml_collections

from configs import eval_demo, mtp_demo, opd_demo, rl_demo, sft_demo

ARGS = (None,)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"pipeline_demo: takes no variant, got {arg!r}")
    c = ml_collections.ConfigDict()
    c.stage = "pipeline"
    c.workdir = "runs/pipeline"
    # The stages this run holds, in pipeline order (a subset skips the others: a stage's
    # input is then its own block's path).
    c.stages = "corpus,sft,opd,rl,mtp,export,eval"
    c.corpus = ml_collections.ConfigDict(
        dict(
            num_scenarios=40,  # training scenarios (a seeded sample of the train split)
            dev_scenarios=5,  # dev scenarios, for SFT's eval split (0: no dev split)
            states_per_scenario=3,
            # "original+augmented" (HSA-SFT) or "original" (the Fixed-Harness ablation)
            states="original+augmented",
            hsa_dims="all",
            hsa_strength=0.5,
            num_shards=2,
            seed=0,
        )
    )
    c.sft = sft_demo.get_config("hsa")
    c.opd = opd_demo.get_config("sft")
    c.rl = rl_demo.get_config("hsa")
    c.mtp = mtp_demo.get_config("sft")
    c.export = ml_collections.ConfigDict(dict(dtype="float32", tokenizer_dir=""))
    c.eval = eval_demo.get_config("hf")
    return c
