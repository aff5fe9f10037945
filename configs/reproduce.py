"""The miniature reproduction of the paper's Table 3 on the tiny model (one CPU machine).

  make reproduce  =  python -m launch.reproduce --config=configs/reproduce.py [--workdir ...]

Arms (`launch._reproduce.NODES`; `arms` picks them, each listed with the arm it starts from):
the base; Fixed-SFT and HSA-SFT from it; each + General OPD toward the base; Fixed-SFT + OPD +
Agentic RL and HSA-SFT + OPD + HSA-RL (`fixed_sft_opd_hsa_rl` and `hsa_sft_opd_agentic_rl`,
the crossed RL arms, can be added). A stage two arms share runs once. Every arm's policy is
evaluated on the same versions of `sets`; `runs/reproduce/report.md` holds the scores with
bootstrap intervals, the paired comparisons, which of the paper's effects reproduce, and the
held-out Harness-edit test (`edit_test`).

Each stage's block is the demo's (`configs/pipeline_demo.py`), resized: SFT runs longer than in
`make demo` and the sets are larger, so intervals are narrower; the whole run is sized to take
well under the 2-hour budget on two CPU cores.
"""

import pathlib

import ml_collections

from configs import pipeline_demo

# The bundled candidate edits of Harness v0's prompt and Skills.
EDITS_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "livestream" / "harness_edits"

ARGS = (None,)
ARMS = (
    "base,fixed_sft,hsa_sft,fixed_sft_opd,hsa_sft_opd,fixed_sft_opd_agentic_rl,hsa_sft_opd_hsa_rl"
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg:
        raise ValueError(f"reproduce: takes no variant, got {arg!r}")
    c = ml_collections.ConfigDict()
    c.stage = "reproduce"
    c.workdir = "runs/reproduce"
    c.arms = ARMS
    c.sets = "t1,t2,t3_tool,t3_prompt,general"
    # Paired bootstrap of every comparison (and the per-arm intervals).
    c.resamples = 10_000
    c.seed = 0
    # "Level" (HSA-SFT vs Fixed-SFT on T1): the interval of the delta within +-this (x1, not x100).
    c.level_margin = 0.05
    # An effect on T1/T2 needs an arm that does the task: below this mean Effectiveness in both
    # arms the verdict is "task not learned", whatever the interval.
    c.min_effectiveness = 0.1
    p = pipeline_demo.get_config()
    # 600 scenarios x 2 states (about 1,200 episodes; SFT sees each half of them once in 300
    # steps of 2 rows). 300 steps take the SFT time 96 steps took with dense attention
    # (2.1 s a step now against 6.5). A 1,000-step HSA-SFT from the demo base on this corpus:
    # dev loss 1.37 / 1.24 / 1.14 / 1.06 at steps 250 / 500 / 750 / 1,000.
    p.corpus.num_scenarios = 600
    p.sft.trainer.update(dict(total_steps=300, eval_every=100, checkpoint_every=100))
    p.sft.optimizer.update(dict(warmup_steps=20, decay_steps=300))
    p.base.trainer.update(dict(total_steps=120, eval_every=40, checkpoint_every=40))
    p.base.optimizer.decay_steps = 120  # the base as measured before (the demo's: 100 steps)
    p.sft.data.update(dict(tool_choice_records=16, copy_probe_samples=8))
    p.rl.rollout.scenarios = 2  # x group_size 4 = 8 episodes per update (the demo: 4)
    p.rl.trainer.batch_size = 8
    p.rl.eval.update(dict(scenarios=4, trajectories=2))
    p.eval.sizes.update(dict(t1=24, t2=24, t3_tool=12, t3_prompt=12, general=40))
    c.pipeline = p
    # The held-out Harness-edit test (paper §5.5; `launch._edit_test`): candidate prompt/Skill
    # edits chosen on dev cases, frozen, applied unchanged to these arms' checkpoints (Fixed-
    # Harness SFT and HAT, as in the paper); error counts on held-out cases before and after.
    # arms="" skips it.
    c.edit_test = ml_collections.ConfigDict(
        dict(
            arms="fixed_sft,hsa_sft_opd_hsa_rl",
            candidates=str(EDITS_DIR),  # edit files and/or folders of them, comma-separated
            dev_cases=16,  # scenarios of the dev split the edit is chosen on
            heldout_cases=32,  # scenarios of the test split it is measured on
        )
    )
    return c
