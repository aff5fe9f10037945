# Over 400 lines: pure functions with their shapes and formulas, the math users read together.
"""Group-relative advantages for HSA-RL: GRPO, GDPO and HAT's per-segment advantage pools.

Algorithm (HSA-RL, paper §3.3 and Appendix C). For every prompt the policy rolls out G complete
trajectories; each trajectory is cut into *segments* that are scored separately:

* tool-call segments (Skill loading and tool invocations), scored on Tool Rationality and
  Skill Selection;
* reply segments (the final public reply), scored on Accuracy and Effectiveness.

Tool segments and reply segments form separate advantage pools. Within a pool, GDPO
(arXiv 2601.05242) normalises every reward dimension k inside its rollout group,
``Â_k = (r_k − μ_k) / (σ_k + ε)`` (Bessel σ), sums the normalised dimensions with weights, and
normalises the sum over the batch. An auxiliary CoT-length dimension ``−q(L)`` joins the sum
with the post-normalisation weight λ (see `hat_advantages`). Samples whose *final* advantage is
zero carry no learning signal and are filtered out of the loss (`zero_advantage_filter`).

Grouping. Group ids are arbitrary int32 values: they need not be contiguous, sorted or small.
They are mapped to dense ranks in ``[0, N)`` by one sort (O(N log N)), after which every
per-group statistic is a ``jax.ops.segment_*`` reduction with the static bound
``num_segments = N`` (a batch of N rows has at most N groups). This keeps memory O(N) and
shapes static, so everything here is ``jax.jit``-compatible and shape polymorphic over N,
unlike an [N, N] equality-matrix formulation whose memory grows as N². Hyperparameters that
change the program (``scale_by_std``, ``batch_norm``) are static; numbers (``eps``,
``weights``, λ, thresholds) are array arguments, so sweeping them does not recompile.

Degenerate groups. A group whose values are all equal (including a group of one) gives
advantage exactly 0, detected with an exact max == min test rather than a small-σ threshold,
so zero-advantage filtering sees true zeros and not rounding noise.

Padding. Every function takes an optional ``valid: f32[N]`` (1 = real row, 0 = padding) so
batches can be padded to bucketed shapes without recompiling; padding rows are excluded from
all statistics and receive advantage 0.

This module holds only array math: rewards come from `rl.rewards`, losses from `rl.losses`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

TOOL = 0
"""Segment kind of a tool-call segment (Skill loading, tool invocations)."""
REPLY = 1
"""Segment kind of a reply segment (the final public reply)."""
REWARD_DIMS = ("tool_rationality", "skill_selection", "accuracy", "effectiveness")
"""Column order of the ``rewards: f32[N, 4]`` argument of `hat_advantages`."""


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _host_or_device(x, dtype=None):
    """Device and traced arrays as they are; host values (lists, numpy) as numpy on the host.

    Host inputs stay numpy until they enter the jitted core, so eager calls compile one
    program, not one per conversion.
    """
    if isinstance(x, jax.Array):
        return x if dtype is None else x.astype(dtype)
    return np.asarray(x, dtype)


def _f32(x):
    return _host_or_device(x, np.float32)


def _check_valid(valid, n: int):
    if valid is not None and jnp.shape(valid) != (n,):
        raise ValueError(f"valid must have shape ({n},), got {jnp.shape(valid)}")
    return valid


def _as_valid(valid, n: int) -> jax.Array:
    if valid is None:
        return jnp.ones((n,), jnp.float32)
    return (jnp.asarray(valid) > 0).astype(jnp.float32)


def _check_group_ids(group_ids, n: int):
    group_ids = _host_or_device(group_ids)
    if group_ids.shape != (n,):
        raise ValueError(
            f"group_ids must have shape ({n},) to match rewards, got {group_ids.shape}"
        )
    if not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(f"group_ids must be integers, got dtype {group_ids.dtype}")
    return group_ids


def _check_finite(name: str, x, valid) -> None:
    """Rejects NaN/inf in valid rows when values are known (eager calls); tracers pass."""
    if not (_is_concrete(x) and _is_concrete(valid)):
        return
    x = np.asarray(x, np.float32)
    valid = np.ones(x.shape[0], bool) if valid is None else np.asarray(valid) > 0
    bad = ~np.isfinite(x).all(axis=tuple(range(1, x.ndim))) & valid
    if bad.any():
        raise ValueError(f"{name} has NaN or inf in rows {np.flatnonzero(bad).tolist()}")


def _dense_groups(group_ids: jax.Array) -> jax.Array:
    """Maps arbitrary int group ids i32[N] to dense ranks i32[N] in [0, N).

    One stable sort, then a running count of id changes (what ``jnp.unique(size=N,
    return_inverse=True)`` computes, at a fraction of its compile time).
    """
    n = group_ids.shape[0]
    order = jnp.argsort(group_ids, stable=True)
    ordered = group_ids[order]
    starts = jnp.zeros((n,), bool).at[1:].set(ordered[1:] != ordered[:-1])
    rank = jnp.cumsum(starts.astype(jnp.int32))
    return jnp.zeros((n,), jnp.int32).at[order].set(rank)


def _group_normalize(x, segments, valid, num_segments, *, eps, scale_by_std):
    """Per-group (x − μ)/(σ + ε) of every column.

    Args:
      x: f32[N, D] values; each column is normalised independently.
      segments: i32[N] dense group index in [0, num_segments).
      valid: f32[N] 1 for real rows, 0 for padding.
      num_segments: static bound on the number of groups.
      eps: added to the Bessel-corrected group std.
      scale_by_std: divide by σ + ε (GRPO); if False only centre (Dr. GRPO).

    Returns:
      f32[N, D]; exactly 0 for padding rows and for columns whose group values are all equal.
    """

    def gather(values):
        return values[segments]

    v = valid[:, None]
    x = jnp.where(v > 0, x, 0.0)  # padding may hold anything, even NaN
    count = gather(jax.ops.segment_sum(valid, segments, num_segments))[:, None]
    mean = gather(jax.ops.segment_sum(x * v, segments, num_segments)) / jnp.maximum(count, 1.0)
    centered = (x - mean) * v
    if scale_by_std:
        sq = gather(jax.ops.segment_sum(centered**2, segments, num_segments))
        std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
        adv = centered / (std + eps)
    else:
        adv = centered
    hi = gather(jax.ops.segment_max(jnp.where(v > 0, x, -jnp.inf), segments, num_segments))
    lo = gather(jax.ops.segment_min(jnp.where(v > 0, x, jnp.inf), segments, num_segments))
    informative = (hi > lo) & (v > 0)
    return jnp.where(informative, adv, 0.0)


def _batch_scale(a, valid, *, eps):
    """Divides f32[N] group-centred advantages by their Bessel std over the valid rows.

    GDPO's batch normalisation is (a − mean_batch)/(std_batch + ε). Group-normalised values
    sum to zero inside every group, so mean_batch is exactly 0 analytically; subtracting the
    float estimate would only add rounding noise and turn true zeros (all-equal groups) into
    tiny non-zeros that zero-advantage filtering could no longer see. So only the scale is
    applied; the std is still computed about the float mean.
    """
    n = jnp.sum(valid)
    mean = jnp.sum(a * valid) / jnp.maximum(n, 1.0)
    var = jnp.sum(((a - mean) * valid) ** 2) / jnp.maximum(n - 1.0, 1.0)
    scale = jnp.sqrt(var) + eps
    # std 0 means every valid value equals the (analytically zero) mean: nothing to scale.
    return jnp.where(valid > 0, a / jnp.where(scale > 0, scale, 1.0), 0.0)


def grpo(rewards, group_ids, *, eps, scale_by_std=True, valid=None) -> jax.Array:
    """GRPO group-relative advantages ``(r − μ_g)/(σ_g + ε)``.

    Args:
      rewards: f32[N] scalar reward per rollout (or segment).
      group_ids: i32[N] group of each row (rollouts of the same prompt); any int values.
      eps: added to the group std; keeps groups with tiny spread finite.
      scale_by_std: if False, return only ``r − μ_g`` (Dr. GRPO, no std scaling).
      valid: optional f32[N]; 0 marks padding rows, excluded from the statistics.

    Returns:
      f32[N] advantages. σ_g is the Bessel-corrected (ddof=1) group std. A group whose rewards
      are all equal, and a group of one, gives exactly 0.
    """
    rewards = _f32(rewards)
    if rewards.ndim != 1:
        raise ValueError(f"grpo expects rewards f32[N], got shape {rewards.shape}")
    n = rewards.shape[0]
    group_ids = _check_group_ids(group_ids, n)
    _check_finite("rewards", rewards, _check_valid(valid, n))
    return _grpo_jit(rewards, group_ids, valid, eps, scale_by_std=scale_by_std)


@functools.partial(jax.jit, static_argnames="scale_by_std")
def _grpo_jit(rewards, group_ids, valid, eps, *, scale_by_std):
    n = rewards.shape[0]
    segments, valid = _dense_groups(group_ids), _as_valid(valid, n)
    adv = _group_normalize(rewards[:, None], segments, valid, n, eps=eps, scale_by_std=scale_by_std)
    return adv[:, 0]


def gdpo(rewards, group_ids, weights, *, eps, batch_norm=True, valid=None) -> jax.Array:
    """GDPO multi-reward advantages: per-dimension group normalisation, weighted sum, batch norm.

    ``A = BN(Σ_k w_k (r_k − μ_{g,k})/(σ_{g,k} + ε))`` with Bessel σ in the group and
    ``BN(a) = a/(σ_batch + ε)`` (the batch mean of the sum is exactly 0, see `_batch_scale`).
    Normalising dimensions separately keeps a dense dimension from drowning a sparse one, which
    is what plain GRPO on the summed reward does.

    Args:
      rewards: f32[N, D] one column per reward dimension.
      group_ids: i32[N] group of each row; any int values.
      weights: f32[D] weight of each normalised dimension.
      eps: added to every std (group and batch).
      batch_norm: normalise the weighted sum over the valid rows of the batch.
      valid: optional f32[N]; 0 marks padding rows.

    Returns:
      f32[N] advantages; exactly 0 for padding rows and for rows whose every dimension is
      constant within its group.
    """
    rewards = _f32(rewards)
    if rewards.ndim != 2:
        raise ValueError(f"gdpo expects rewards f32[N, D], got shape {rewards.shape}")
    n, d = rewards.shape
    weights = _f32(weights)
    if weights.shape != (d,):
        raise ValueError(f"weights must have shape ({d},) to match rewards, got {weights.shape}")
    group_ids = _check_group_ids(group_ids, n)
    _check_finite("rewards", rewards, _check_valid(valid, n))
    return _gdpo_jit(rewards, group_ids, weights, valid, eps, batch_norm=batch_norm)


@functools.partial(jax.jit, static_argnames="batch_norm")
def _gdpo_jit(rewards, group_ids, weights, valid, eps, *, batch_norm):
    n = rewards.shape[0]
    segments, valid = _dense_groups(group_ids), _as_valid(valid, n)
    per_dim = _group_normalize(rewards, segments, valid, n, eps=eps, scale_by_std=True)
    total = per_dim @ weights
    return _batch_scale(total, valid, eps=eps) if batch_norm else total


def cot_length_penalty(lengths, *, low=100.0, high=200.0) -> jax.Array:
    """The CoT-length penalty ``q(L) = clip((L − low)/(high − low), 0, 1)``.

    The paper (§3.3, App. C) discourages reasoning longer than thresholds of 100 and 200 tokens
    and logs mean q(L) falling from 0.466 to 0.272, but does not publish q itself. This linear
    ramp — free below ``low``, full penalty at or above ``high`` — is an assumption; both
    thresholds are configurable.

    Args:
      lengths: f32[...] CoT (reasoning) token counts, one per segment.
      low: length at which the penalty starts (0 at and below).
      high: length at which the penalty saturates (1 at and above); must exceed ``low``.

    Returns:
      f32[...] penalty in [0, 1].
    """
    if not high > low:
        raise ValueError(f"cot length thresholds need high > low, got low={low}, high={high}")
    lengths = jnp.asarray(lengths, jnp.float32)
    return jnp.clip((lengths - low) / (high - low), 0.0, 1.0)


def zero_advantage_filter(advantages, valid=None, *, atol=0.0) -> jax.Array:
    """Keep-mask for zero-advantage filtering, computed on the *final* advantage.

    A sample with advantage 0 contributes nothing to the policy gradient but still counts in
    the loss denominators, diluting the signal of the rest; HSA-RL drops such samples. The mask
    has the input's shape (no data-dependent shapes): multiply it into the token loss mask,
    ``mask * keep[:, None]``, so filtered rows also leave the denominators.

    Args:
      advantages: f32[N] (or any shape) final advantages.
      valid: optional f32 mask of the same shape; 0 rows are never kept.
      atol: rows with ``|A| <= atol`` are dropped (0.0 drops exact zeros only).

    Returns:
      f32 of the input's shape: 1.0 to keep, 0.0 to drop.
    """
    advantages = jnp.asarray(advantages)
    keep = jnp.abs(advantages) > atol
    if valid is not None:
        keep = keep & (jnp.asarray(valid) > 0)
    return keep.astype(jnp.float32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HatAdvantageConfig:
    """Settings of HAT's segment-pool advantages (defaults from paper §3.3 and App. C).

    Attributes:
      tool_weights: GDPO weights of (Tool Rationality, Skill Selection) in the tool pool.
      reply_weights: GDPO weights of (Accuracy, Effectiveness) in the reply pool.
      length_weight: λ, the post-normalisation weight of the CoT-length dimension −q(L);
        0 disables it.
      length_low: q(L) threshold where the penalty starts.
      length_high: q(L) threshold where the penalty saturates.
      eps: added to group and batch stds.
      batch_norm: normalise each pool's weighted sum over that pool's rows of the batch.
      filter_atol: zero-advantage filtering drops rows with ``|A| <= filter_atol``.
    """

    tool_weights: tuple[float, float] = (1.0, 1.0)
    reply_weights: tuple[float, float] = (1.0, 1.0)
    length_weight: float = 0.1
    length_low: float = 100.0
    length_high: float = 200.0
    eps: float = 1e-6
    batch_norm: bool = True
    filter_atol: float = 0.0

    def __post_init__(self):
        for name in ("tool_weights", "reply_weights"):
            value = getattr(self, name)
            if len(value) != 2 or not all(np.isfinite(w) for w in value):
                raise ValueError(f"HatAdvantageConfig.{name} must be 2 finite floats, got {value}")
        if not (np.isfinite(self.length_weight) and self.length_weight >= 0):
            raise ValueError(
                f"HatAdvantageConfig.length_weight must be >= 0, got {self.length_weight}"
            )
        if not self.length_high > self.length_low:
            raise ValueError(
                "HatAdvantageConfig needs length_high > length_low, got "
                f"{self.length_low} and {self.length_high}"
            )
        if not self.eps >= 0 or not self.filter_atol >= 0:
            raise ValueError(
                f"HatAdvantageConfig eps and filter_atol must be >= 0, got {self.eps}, {self.filter_atol}"
            )


class HatAdvantages(NamedTuple):
    """Output of `hat_advantages`; every field is f32[N].

    Attributes:
      advantages: final advantage per segment (0 for padding rows).
      keep: zero-advantage filter mask on ``advantages`` (1 keep, 0 drop).
      length_penalty: q(L) per segment; the paper logs ``−λ·mean(q)`` as the raw contribution
        of the length term before normalisation.
    """

    advantages: jax.Array
    keep: jax.Array
    length_penalty: jax.Array


def hat_advantages(
    rewards, kinds, group_ids, cot_lengths, config: HatAdvantageConfig, *, valid=None
) -> HatAdvantages:
    """HAT's per-segment advantages: two GDPO pools plus the CoT-length term, then filtering.

    Pools. Rows with ``kinds == TOOL`` use columns (tool_rationality, skill_selection) of
    ``rewards``; rows with ``kinds == REPLY`` use (accuracy, effectiveness); the other two
    columns of a row are ignored (they may hold anything, even NaN). A pool's group is the pair
    (group id, kind): tool segments are only ever compared with tool segments of the same
    rollout group, reply segments with reply segments. Batch normalisation is per pool too.

    Where λ·q enters. The length term is a third GDPO dimension of each pool with raw reward
    ``−q(L)``: it is normalised within the group like the task dimensions, multiplied by
    λ = ``config.length_weight`` in the weighted sum — λ is a *post-normalisation* weight —
    and only then is the sum batch-normalised::

        S = w_a Â_a + w_b Â_b + λ · N_g(−q(L)),   A = S / (σ_batch(S) + ε)

    Normalising −q first makes λ a scale-free knob: the raw q ranges over [0, 1] while task
    rewards are binary or {0, .5, 1}, and only the normalised dimensions have commensurate
    unit scale; applying λ before batch normalisation keeps the final advantage at unit scale.
    The raw contribution the paper logs is ``−λ·q(L)`` (mean −0.0466 → −0.0272).

    Args:
      rewards: f32[N, 4] columns in `REWARD_DIMS` order.
      kinds: i32[N] `TOOL` (0) or `REPLY` (1); other values are treated as padding.
      group_ids: i32[N] rollout group (prompt) of each segment; any int values.
      cot_lengths: f32[N] reasoning token count L of each segment.
      config: weights, λ, thresholds, eps and filtering.
      valid: optional f32[N]; 0 marks padding rows.

    Returns:
      `HatAdvantages` (advantages, keep, length_penalty), each f32[N].
    """
    rewards = _f32(rewards)
    if rewards.ndim != 2 or rewards.shape[1] != len(REWARD_DIMS):
        raise ValueError(
            f"hat_advantages expects rewards f32[N, 4] {REWARD_DIMS}, got {rewards.shape}"
        )
    n = rewards.shape[0]
    kinds = _host_or_device(kinds)
    if kinds.shape != (n,):
        raise ValueError(f"kinds must have shape ({n},), got {kinds.shape}")
    cot_lengths = _f32(cot_lengths)
    if cot_lengths.shape != (n,):
        raise ValueError(f"cot_lengths must have shape ({n},), got {cot_lengths.shape}")
    group_ids = _check_group_ids(group_ids, n)
    _check_valid(valid, n)
    if all(_is_concrete(x) for x in (rewards, kinds, cot_lengths, valid)):
        k = np.asarray(kinds)
        rows = ((k == TOOL) | (k == REPLY)) & (True if valid is None else np.asarray(valid) > 0)
        pool = np.where(
            (k == TOOL)[:, None], np.asarray(rewards)[:, :2], np.asarray(rewards)[:, 2:]
        )
        _check_finite("rewards (the row's pool columns)", pool, rows)
        _check_finite("cot_lengths", cot_lengths, rows)
    # Numbers travel as arrays so that sweeping λ, weights or thresholds does not recompile.
    numbers = {
        "tool_weights": (*config.tool_weights, config.length_weight),
        "reply_weights": (*config.reply_weights, config.length_weight),
        "length": (config.length_low, config.length_high),
        "eps": config.eps,
        "atol": config.filter_atol,
    }
    numbers = {k: np.asarray(v, np.float32) for k, v in numbers.items()}
    args = (rewards, kinds, group_ids, cot_lengths, valid, numbers)
    return _hat_jit(*args, batch_norm=config.batch_norm)


@functools.partial(jax.jit, static_argnames="batch_norm")
def _hat_jit(rewards, kinds, group_ids, cot_lengths, valid, numbers, *, batch_norm):
    n = rewards.shape[0]
    is_tool = kinds == TOOL
    valid = _as_valid(valid, n) * ((kinds == TOOL) | (kinds == REPLY))
    segments = _dense_groups(group_ids) * 2 + is_tool.astype(jnp.int32)
    task = jnp.where(is_tool[:, None], rewards[:, :2], rewards[:, 2:])
    low, high = numbers["length"]
    q = jnp.clip((cot_lengths - low) / (high - low), 0.0, 1.0)  # cot_length_penalty
    dims = jnp.concatenate([task, -q[:, None]], axis=1)
    weights = jnp.where(is_tool[:, None], numbers["tool_weights"], numbers["reply_weights"])
    eps = numbers["eps"]
    per_dim = _group_normalize(dims, segments, valid, 2 * n, eps=eps, scale_by_std=True)
    total = jnp.sum(per_dim * weights, axis=1)
    if batch_norm:
        tool_valid = valid * is_tool
        total = jnp.where(
            is_tool,
            _batch_scale(total, tool_valid, eps=eps),
            _batch_scale(total, valid - tool_valid, eps=eps),
        )
    keep = zero_advantage_filter(total, valid, atol=numbers["atol"])
    return HatAdvantages(advantages=total, keep=keep, length_penalty=jnp.where(valid > 0, q, 0.0))
