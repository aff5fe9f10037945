"""From episodes to the per-segment arrays of HAT's advantage pools (`rl.advantages`).

HSA-RL scores two kinds of segment separately (paper §3.3, App. C): tool-call segments (model
rounds that load Skills and call tools) get Tool Rationality and Skill Selection; reply
segments (rounds that reply) get Accuracy and Effectiveness. One model round is one segment:
a round whose calls include a reply (public, private or no reply) or whose text is a reply is a
reply segment, every other round a tool-call segment. The episode's rewards are broadcast to
its segments; `cot_lengths` is the reasoning length of each round, which the CoT-length term
q(L) penalises (thresholds 100 and 200 tokens).

`hat_advantages(rewards, kinds, group_ids, cot_lengths, config)` takes exactly what
`batch_segments` returns.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np

from hat_jax import harness as hx
from rl.advantages import REPLY, TOOL
from rl.rewards._rules import RewardVector

_REPLY = {"reply_public", "reply_private", "no_reply"}
_PIECES = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """A tokenizer-free token count: words and punctuation marks. Pass a real tokenizer's
    length function to `segments` when the policy's tokenizer is at hand."""
    return len(_PIECES.findall(text))


@dataclasses.dataclass(frozen=True)
class EpisodeSegments:
    """One episode's tool-call and reply segments (its model rounds), rewards broadcast.

    Not the packing segments of token rows (`segment_ids` of a training batch).

    Attributes:
      rewards: f32[S, 4] the episode's rewards in `REWARD_DIMS` order, per segment.
      kinds: i32[S] `TOOL` or `REPLY`.
      cot_lengths: f32[S] reasoning tokens of each segment.
      rounds: i32[S] the model round (1-based) each segment is.
    """

    rewards: np.ndarray
    kinds: np.ndarray
    cot_lengths: np.ndarray
    rounds: np.ndarray

    def __len__(self) -> int:
        return int(self.kinds.shape[0])


def segment_kind(call: hx.ModelCall, renames: hx.RenameMap) -> int:
    """`REPLY` if the round replied (a reply tool or plain text), else `TOOL`."""
    out = call.output or {}
    calls = out.get("tool_calls") or []
    names = {renames.canonical_tool(c["function"]["name"]) for c in calls}
    if names & _REPLY or (not calls and (out.get("content") or "").strip()):
        return REPLY
    return TOOL


def segments(
    trajectory: hx.Trajectory,
    rewards: RewardVector,
    *,
    count_tokens: Callable[[str], int] = approx_tokens,
) -> EpisodeSegments:
    """The segments of one episode (rounds whose policy call failed are skipped)."""
    renames = hx.RenameMap.from_dict(trajectory.renames)
    vector = rewards.as_array()
    rows = [
        (segment_kind(c, renames), count_tokens((c.output or {}).get("reasoning") or ""), c.round)
        for c in trajectory.model_calls
        if c.output is not None
    ]
    n = len(rows)
    return EpisodeSegments(
        rewards=np.tile(vector, (n, 1)).astype(np.float32),
        kinds=np.asarray([r[0] for r in rows], np.int32).reshape(n),
        cot_lengths=np.asarray([r[1] for r in rows], np.float32).reshape(n),
        rounds=np.asarray([r[2] for r in rows], np.int32).reshape(n),
    )


def batch_segments(
    episodes: Sequence[EpisodeSegments], group_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Concatenates episodes into `(rewards f32[N,4], kinds i32[N], group_ids i32[N],
    cot_lengths f32[N])`, each episode's segments carrying its rollout group id."""
    if len(episodes) != len(group_ids):
        raise ValueError(f"{len(episodes)} episodes but {len(group_ids)} group ids")
    if not episodes:
        empty = np.zeros((0,), np.float32)
        return np.zeros((0, 4), np.float32), empty.astype(np.int32), empty.astype(np.int32), empty
    return (
        np.concatenate([e.rewards for e in episodes]),
        np.concatenate([e.kinds for e in episodes]),
        np.concatenate([np.full(len(e), g, np.int32) for e, g in zip(episodes, group_ids)]),
        np.concatenate([e.cot_lengths for e in episodes]),
    )
