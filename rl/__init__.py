"""Reinforcement learning and distillation: live-room simulator, rewards, advantage and loss
math (pure functions), on-policy distillation and rollouts. Holds no mesh axis names.

General OPD (`rl._opd_stage`, `_opd_loss`, `_opd_sampling`): `run_opd(OPDConfig(...),
student_config=, teacher_config=, run_dir=, prompts=, heldout=, tokenizer=, init_student=,
init_teacher=) -> OPDResult` (the student samples with its current weights, the frozen base
scores the same tokens, exact reverse KL; held-out KL and instruction pass rates
before/after), `opd_driver`, `opd_loss`, `OPDSource`, `StudentSampler`. CLI:
`python -m launch.opd`.

MTP draft-head adaptation (`rl.mtp`, where every MTP piece is listed): `run_mtp(MTPConfig(...),
model_config=, run_dir=, prompts=, eval_prompts=, init_policy=, init_head=) -> MTPResult`
(policy frozen, head trained on the policy's own rollouts; before/after loss, acceptance and
simulated acceptance length), `mtp_stage_loss`, `Drafter`, `RolloutConfig`, `RolloutPool`,
`generate_rollouts`, `prompts_from_rows` (agent prompts from training rows), `MTP_RANDOM`
(explicit random initialisation), and the head's math `mtp_targets`, `mtp_loss`,
`acceptance_probability`, `acceptance_length`. CLI: `python -m launch.mtp`.

HSA-RL (`rl._rl_stage`, `_rl_source`, `_rl_loss`, `_rollout`): `run_rl(RLConfig(...),
model_config=, run_dir=, tokenizer=, init_policy=) -> RLResult` (lockstep-batched group
rollouts of whole episodes in the live room, HAT advantages, GSPO updates; held-out rewards
before/after), `rl_driver`, `rl_loss`, `RLSource`, `rollout`. CLI: `python -m launch.rl`.

Local policy: `JaxPolicy(model, tokenizer)` is a `hat_jax.harness.PolicyModel` sampling from a
`models.Qwen` with `models.Sampler` (`generate`, and `generate_batch` for group rollouts).
"""

from rl import advantages, distill, losses, mtp, rewards, sim
from rl._jax_policy import JaxPolicy
from rl._opd_loss import ESTIMATORS as OPD_ESTIMATORS
from rl._opd_loss import opd_loss
from rl._opd_sampling import OPDSource, StudentSampler
from rl._opd_stage import OPDConfig, OPDResult, opd_driver, run_opd
from rl._rl_loss import RL_KEYS, rl_loss
from rl._rl_source import RLRolloutConfig, RLSource, segment_advantages, slot_decoder_for
from rl._rl_stage import RLConfig, RLResult, recompute_logprobs, rl_driver, run_rl
from rl._rollout import Continuous, Lockstep, Rollouts, Segment, rollout
from rl._rollout import rows as rollout_rows
from rl.advantages import (
    REPLY,
    REWARD_DIMS,
    TOOL,
    HatAdvantageConfig,
    HatAdvantages,
    cot_length_penalty,
    gdpo,
    grpo,
    hat_advantages,
    zero_advantage_filter,
)
from rl.distill import (
    opd_token_advantages,
    reverse_kl,
    sampled_reverse_kl_loss,
    token_reverse_kl,
)
from rl.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    aggregate_loss,
    gspo_loss,
    kl_penalty,
    ppo_clip_loss,
    sequence_log_ratio,
)
from rl.mtp import RANDOM as MTP_RANDOM
from rl.mtp import (
    Drafter,
    MTPConfig,
    MTPResult,
    RolloutConfig,
    RolloutPool,
    acceptance_length,
    acceptance_probability,
    generate_rollouts,
    mtp_loss,
    mtp_stage_loss,
    mtp_targets,
    prompts_from_rows,
    run_mtp,
)
from rl.rewards import Rewarder, RewardVector
from rl.sim import LiveRoom, Scenario, ScriptedTeacher, SimConfig

__all__ = [
    # advantages
    "REPLY",
    "REWARD_DIMS",
    "TOOL",
    "HatAdvantageConfig",
    "HatAdvantages",
    "advantages",
    "cot_length_penalty",
    "gdpo",
    "grpo",
    "hat_advantages",
    "zero_advantage_filter",
    # losses
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "aggregate_loss",
    "gspo_loss",
    "kl_penalty",
    "losses",
    "ppo_clip_loss",
    "sequence_log_ratio",
    # distillation (General OPD)
    "distill",
    "opd_token_advantages",
    "reverse_kl",
    "sampled_reverse_kl_loss",
    "token_reverse_kl",
    # General OPD stage
    "OPD_ESTIMATORS",
    "OPDConfig",
    "OPDResult",
    "OPDSource",
    "StudentSampler",
    "opd_driver",
    "opd_loss",
    "run_opd",
    # HSA-RL stage
    "RL_KEYS",
    "Continuous",
    "Lockstep",
    "RLConfig",
    "RLResult",
    "RLRolloutConfig",
    "RLSource",
    "Rollouts",
    "Segment",
    "recompute_logprobs",
    "rl_driver",
    "rl_loss",
    "rollout",
    "rollout_rows",
    "slot_decoder_for",
    "run_rl",
    "segment_advantages",
    # MTP draft-head adaptation stage and its math
    "MTP_RANDOM",
    "Drafter",
    "MTPConfig",
    "MTPResult",
    "RolloutConfig",
    "RolloutPool",
    "acceptance_length",
    "acceptance_probability",
    "generate_rollouts",
    "mtp",
    "mtp_loss",
    "mtp_stage_loss",
    "mtp_targets",
    "prompts_from_rows",
    "run_mtp",
    # local policy
    "JaxPolicy",
    # simulator and rewards (see rl.sim and rl.rewards for their names)
    "LiveRoom",
    "RewardVector",
    "Rewarder",
    "Scenario",
    "ScriptedTeacher",
    "SimConfig",
    "rewards",
    "sim",
]
