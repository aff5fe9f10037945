"""MTP draft-head adaptation (paper App. H): the stage, its rollouts and its math, in one place.

The policy is frozen and its NextN draft head is trained on the policy's own rollouts:

    result = rl.mtp.run_mtp(rl.mtp.MTPConfig(...), model_config=, run_dir=, prompts=,
                            eval_prompts=, init_policy=, init_head=)   # -> MTPResult

- `_loss`: the math, pure and hand-tested: `mtp_targets` (labels of token t + 2, packing
  respected), `mtp_loss` (masked cross-entropy), `acceptance_probability` (Σ_v min(p, q))
  and `acceptance_length` (simulated tokens per verification with k drafts).
- `_rollouts`: `generate_rollouts` (the frozen policy continues prompt batches; the sampled
  tokens are the loss mask), `RolloutPool` (the rows as a resumable `DataSource`),
  `RolloutConfig`, `prompts_from_rows` (agent prompts cut from SFT rows).
- `_stage`: `run_mtp` on `hat_jax.train`'s stage driver (`Drafter`: policy frozen, head
  trained), `mtp_stage_loss`, `MTPConfig`, `MTPResult`, the before/after summary.

The rest of MTP lives where the layout puts it, and this package uses it: the head module
`models.MTPHead` and self-speculative decoding `models.Sampler(mtp=...)` (`models/_mtp.py`,
`models/_sampler.py`); HF conversion of the `mtp.*` tensors (`serve.convert`: `load_mtp`,
`restore_mtp`, `graft`, `save_hf(..., mtp=)`); the prompts (`data.opd_prompt_data`, or
`prompts_from_rows` over `data.sft_data`); configs `configs/mtp_*.py`; the CLI
`python -m launch.mtp`. `rl` re-exports the public names below (`RANDOM` as `MTP_RANDOM`).
"""

from rl.mtp._loss import acceptance_length, acceptance_probability, mtp_loss, mtp_targets
from rl.mtp._rollouts import RolloutConfig, RolloutPool, generate_rollouts, prompts_from_rows
from rl.mtp._stage import RANDOM, Drafter, MTPConfig, MTPResult, mtp_stage_loss, run_mtp

__all__ = [
    # the math (`_loss`)
    "acceptance_length",
    "acceptance_probability",
    "mtp_loss",
    "mtp_targets",
    # rollouts of the frozen policy (`_rollouts`)
    "RolloutConfig",
    "RolloutPool",
    "generate_rollouts",
    "prompts_from_rows",
    # the stage (`_stage`)
    "RANDOM",
    "Drafter",
    "MTPConfig",
    "MTPResult",
    "mtp_stage_loss",
    "run_mtp",
]
