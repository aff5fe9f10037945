"""Rewards of HSA-RL (paper §3.3): rule-based Accuracy, Effectiveness, Tool Rationality and
Skill Selection; per-segment arrays (with reasoning lengths for the CoT term) for
`rl.advantages.hat_advantages`; and an optional panel of three OpenAI-compatible LLM judges
with majority vote and an agreement report against the rule labels.

    rewarder = Rewarder()
    vector = rewarder.score(scenario, trajectory, state)      # RewardVector
    seg = segments(trajectory, vector)                        # per model round
    rewards, kinds, group_ids, cot = batch_segments([seg, ...], group_ids)
"""

from rl.rewards._facts import clock_times, content_words, money, states, text_recall
from rl.rewards._judge import (
    JUDGE_FAILURES,
    PROMPTS,
    JudgedRewarder,
    JudgeEndpoint,
    JudgePanel,
    JudgeUnavailable,
    JudgeVote,
    PanelVerdict,
    agreement_report,
    parse_vote,
    write_report,
)
from rl.rewards._rules import ACK, ENV_FAULTS, RewardConfig, Rewarder, RewardVector
from rl.rewards._segments import (
    EpisodeSegments,
    approx_tokens,
    batch_segments,
    segment_kind,
    segments,
)

__all__ = [
    "ACK",
    "JUDGE_FAILURES",
    "JudgeUnavailable",
    "JudgedRewarder",
    "ENV_FAULTS",
    "EpisodeSegments",
    "PROMPTS",
    "JudgeEndpoint",
    "JudgePanel",
    "JudgeVote",
    "PanelVerdict",
    "RewardConfig",
    "RewardVector",
    "Rewarder",
    "agreement_report",
    "approx_tokens",
    "batch_segments",
    "clock_times",
    "content_words",
    "money",
    "parse_vote",
    "segment_kind",
    "segments",
    "states",
    "text_recall",
    "write_report",
]
