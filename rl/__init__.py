"""Reinforcement learning and distillation: live-room simulator, rewards, advantage and loss
math (pure functions), on-policy distillation and rollouts. Holds no mesh axis names."""

from rl import advantages, distill, losses, rewards, sim
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
    acceptance_length,
    acceptance_probability,
    mtp_loss,
    mtp_targets,
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
    # distillation and MTP
    "acceptance_length",
    "acceptance_probability",
    "distill",
    "mtp_loss",
    "mtp_targets",
    "opd_token_advantages",
    "reverse_kl",
    "sampled_reverse_kl_loss",
    "token_reverse_kl",
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
