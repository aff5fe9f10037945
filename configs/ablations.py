"""The paper's training-stage ablations as named pipeline configs (`configs/pipeline_demo.py`
with each arm's differences only).

  python -m launch.pipeline --config=configs/ablations.py:<arm>

Arms (each writes under `runs/ablations/<arm>` and evaluates its export on the same set
versions, `eval.sets_dir`, so arms compare item by item):

- `hsa_sft` (the reference): the base (general instructions, scored on the general set),
  HSA-SFT from it, then export and evaluation (compared item by item with the base's).
- `fixed_sft`: Fixed-Harness SFT: a corpus of the original Harness only (same number of
  episodes per scenario) and no online HSA.
- `hsa_sft_opd`, `fixed_sft_opd`: either SFT arm followed by General OPD toward the base.
- `hsa_rl`, `agentic_rl`: HSA-SFT + General OPD, then RL with HSA (`rl_demo`'s default) or
  Agentic RL (the original Harness in every episode); `fixed_sft_hsa_rl` and
  `fixed_sft_agentic_rl` start from Fixed-Harness SFT + General OPD instead.
- `hsa_dim_<dim>`: HSA-SFT with one HSA dimension only (`hat_jax.hsa.Dim`), in the corpus and
  in online HSA.

MTP adaptation is deployment, not quality: no arm runs it (the export holds no draft head).
"""

import ml_collections

from configs import pipeline_demo

_DIMS = ("skill_id", "skill_content", "tool_def", "system_prompt", "hook")
_BASE_STAGES = "base,corpus,sft,export,eval"
_OPD_STAGES = "base,corpus,sft,opd,export,eval"
_RL_STAGES = "base,corpus,sft,opd,rl,export,eval"
ARGS = (
    "hsa_sft", "fixed_sft", "hsa_sft_opd", "fixed_sft_opd", "hsa_rl", "agentic_rl",
    "fixed_sft_hsa_rl", "fixed_sft_agentic_rl", *(f"hsa_dim_{d}" for d in _DIMS),
)  # fmt: skip


def as_fixed_sft(c: ml_collections.ConfigDict) -> None:
    """Fixed-Harness SFT: the original Harness's corpus and no online HSA (in place)."""
    c.corpus.states = "original"
    c.sft.data.harness_mode = "fixed"
    c.sft.data.online_hsa_probability = 0.0


def as_agentic_rl(c: ml_collections.ConfigDict) -> None:
    """Agentic RL: every episode under the original Harness (in place)."""
    c.rl.sim.original_fraction = 1.0
    c.rl.sim.hsa_dims = ""


def get_config(arm: str | None = None) -> ml_collections.ConfigDict:
    arm = arm or "hsa_sft"
    if arm not in ARGS:
        raise ValueError(f"ablations: unknown arm {arm!r}; choose one of {ARGS}")
    c = pipeline_demo.get_config()
    c.workdir = f"runs/ablations/{arm}"
    c.stages = _BASE_STAGES
    if arm.startswith("fixed_sft"):
        as_fixed_sft(c)
    if arm.endswith("_opd"):
        c.stages = _OPD_STAGES
    if arm.endswith("_rl"):
        c.stages = _RL_STAGES
    if arm.endswith("agentic_rl"):
        as_agentic_rl(c)
    if arm.startswith("hsa_dim_"):
        c.corpus.hsa_dims = c.sft.data.online_hsa_dims = arm.removeprefix("hsa_dim_")
    return c
