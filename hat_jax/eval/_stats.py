"""Bootstrap statistics over per-item scores: paired comparisons of two runs and plain
intervals of one run's mean.

Two runs are compared on the items both evaluated, paired by item id: the per-item differences
`b - a` are resampled with replacement (item indices drawn from
`numpy.random.Generator(PCG64(seed))`), giving a percentile interval of the mean difference and
the share of resamples in which the difference is not positive (`p_le_zero`, a one-sided
bootstrap P(delta <= 0)). Runs are comparable only when they evaluated the same version of a
set (`SetVersionError` otherwise).

The run directory format (`summary.json`, `items/<set>.jsonl`) is the runner's, and so are its
readers (`hat_jax.eval._run`); `load_summary` and `read_scores` check what they read.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax.eval._items import SetVersionError
from hat_jax.eval._run import ITEMS_DIR, SUMMARY_FILE, read_items, read_summary

# Index draws are made in blocks of at most this many entries (same stream as one call).
_BLOCK = 1 << 22


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """A paired bootstrap comparison of run B against run A on the same items.

    Attributes:
      n: number of paired items.
      mean_a: mean score of run A.
      mean_b: mean score of run B.
      delta: `mean_b - mean_a`.
      low: lower end of the percentile interval of delta.
      high: upper end of the percentile interval of delta.
      p_le_zero: share of resampled deltas <= 0.
      resamples: number of bootstrap resamples.
      seed: the PCG64 seed of the index draws.
      confidence: the interval's confidence level.
    """

    n: int
    mean_a: float
    mean_b: float
    delta: float
    low: float
    high: float
    p_le_zero: float
    resamples: int
    seed: int
    confidence: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval of one run's mean score.

    Attributes:
      n: number of items.
      mean: the mean score.
      low: lower end of the interval.
      high: upper end of the interval.
      confidence: the interval's confidence level.
    """

    n: int
    mean: float
    low: float
    high: float
    confidence: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _vector(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{what}: need a non-empty 1-D sequence of scores, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x))[:5].tolist()
        raise ValueError(f"{what}: non-finite scores at positions {bad}")
    return x


def _check(resamples: int, confidence: float) -> None:
    if resamples < 1:
        raise ValueError(f"bootstrap: resamples must be >= 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap: confidence must be in (0, 1), got {confidence}")


def _resampled_means(
    x: np.ndarray, resamples: int, seed: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Means of `resamples` resamples of `x` (indices drawn row by row from PCG64(seed));
    with `weights`, each resample's weighted mean sum(w x) / sum(w) (e.g. instruction-level
    figures, where an item counts once per instruction)."""
    n = x.size
    rng = np.random.Generator(np.random.PCG64(seed))
    rows = max(1, _BLOCK // n)
    out = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        idx = rng.integers(0, n, size=(k, n))
        if weights is None:
            out[start : start + k] = x[idx].mean(axis=1)
        else:
            w = weights[idx]
            out[start : start + k] = (w * x[idx]).sum(axis=1) / w.sum(axis=1)
    return out


def _weights(weights: Sequence[float] | np.ndarray | None, n: int) -> np.ndarray | None:
    if weights is None:
        return None
    w = _vector(weights, "weights")
    if w.size != n or (w <= 0).any():
        raise ValueError(f"weights: need {n} positive weights, got {w.size} ({w.min()} min)")
    return w


def _percentiles(means: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    weights: Sequence[float] | np.ndarray | None = None,
) -> Bootstrap:
    """Paired bootstrap of `mean(b) - mean(a)` over items scored by both runs.

    Args:
      a: per-item scores of run A (the baseline).
      b: per-item scores of run B on the same items, in the same order.
      resamples: number of resamples of the item indices.
      seed: PCG64 seed of the index draws.
      confidence: level of the percentile interval.
      weights: per-item weights (both runs' means are then weighted means).

    Raises:
      ValueError: the inputs are empty, of different lengths or not finite, or the settings
        are out of range.
    """
    _check(resamples, confidence)
    a, b = _vector(a, "paired_bootstrap a"), _vector(b, "paired_bootstrap b")
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: {a.size} scores in a vs {b.size} in b")
    w = _weights(weights, a.size)
    diff = b - a
    deltas = _resampled_means(diff, resamples, seed, w)
    low, high = _percentiles(deltas, confidence)
    return Bootstrap(
        n=int(a.size),
        mean_a=float(np.average(a, weights=w)),
        mean_b=float(np.average(b, weights=w)),
        delta=float(np.average(diff, weights=w)),
        low=low,
        high=high,
        p_le_zero=float(np.mean(deltas <= 0.0)),
        resamples=resamples,
        seed=seed,
        confidence=confidence,
    )


def mean_interval(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    weights: Sequence[float] | np.ndarray | None = None,
) -> Interval:
    """Bootstrap percentile interval of the (weighted) mean of one run's per-item scores."""
    _check(resamples, confidence)
    x = _vector(values, "mean_interval")
    w = _weights(weights, x.size)
    low, high = _percentiles(_resampled_means(x, resamples, seed, w), confidence)
    return Interval(n=int(x.size), mean=float(np.average(x, weights=w)), low=low, high=high,
                    confidence=confidence)  # fmt: skip


# ------------------------------------------------------------------------------ run directories
def load_summary(run_dir: os.PathLike | str) -> dict[str, Any]:
    """A run's `summary.json` (`_run.read_summary`), checked for what comparisons and reports use.

    Raises:
      FileNotFoundError: the run has no summary.
      ValueError: the summary is not valid JSON, or lacks the `run` or `sets` section or a
        set's `version` or `metrics` (file and set named).
    """
    path = pathlib.Path(run_dir) / SUMMARY_FILE
    try:
        summary = read_summary(run_dir)
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON: {err}") from err
    if not isinstance(summary, Mapping):
        raise ValueError(f"{path}: expected a JSON object")
    for key in ("run", "sets"):
        if not isinstance(summary.get(key), Mapping):
            raise ValueError(f"{path}: missing the {key!r} section")
    for name, entry in summary["sets"].items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("metrics"), Mapping):
            raise ValueError(f"{path}: set {name!r} has no 'metrics'")
        if "version" not in entry:
            raise ValueError(f"{path}: set {name!r} has no 'version'")
    return summary


def read_scores(run_dir: os.PathLike | str, set_name: str) -> dict[str, dict[str, float]]:
    """`{item id: {metric: score}}` of a set's finished items (`_run.read_items`), in file order;
    empty when the run has no items file for the set.

    Raises:
      ValueError: a record lacks its id or scores, or an id repeats (file and record named).
    """
    path = pathlib.Path(run_dir) / ITEMS_DIR / f"{set_name}.jsonl"
    out: dict[str, dict[str, float]] = {}
    for n, record in enumerate(read_items(run_dir, set_name), 1):
        try:
            item_id, scores = str(record["id"]), record["scores"]
            if not isinstance(scores, Mapping):
                raise TypeError("scores are not an object")
            parsed = {str(k): float(v) for k, v in scores.items()}
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: record {n} is not a scored item: {err!r}") from err
        if item_id in out:
            raise ValueError(f"{path}: item {item_id!r} appears twice (record {n})")
        out[item_id] = parsed
    return out


def read_weights(run_dir: os.PathLike | str, set_name: str) -> dict[str, dict[str, float]]:
    """`{item id: {metric: weight}}` of the items whose set kind weighs some metrics."""
    return {str(r["id"]): dict(r["weights"]) for r in read_items(run_dir, set_name)
            if r.get("weights")}  # fmt: skip


def item_weights(
    weights: Mapping[str, Mapping[str, float]], metric: str, ids: Sequence[str]
) -> np.ndarray | None:
    """The weights of `metric` for `ids` (None when the metric is unweighted: a plain mean)."""
    if not any(metric in weights.get(i, {}) for i in ids):
        return None
    return np.array([weights.get(i, {}).get(metric, 1.0) for i in ids], dtype=np.float64)


def metric_scores(
    scores: Mapping[str, Mapping[str, float]], metric: str, ids: Sequence[str], where: str
) -> np.ndarray:
    """The scores of `metric` for `ids`, in that order; `where` names the source in errors."""
    missing = [i for i in ids if metric not in scores[i]][:5]
    if missing:
        raise ValueError(f"{where}: no {metric!r} score for item(s) {missing}")
    return np.array([scores[i][metric] for i in ids], dtype=np.float64)


def _ids_missing(only: Sequence[str], run: os.PathLike | str) -> str:
    shown = ", ".join(repr(i) for i in sorted(only)[:8])
    more = f" and {len(only) - 8} more" if len(only) > 8 else ""
    return f"{len(only)} only in {run}: {shown}{more}"


def compare_runs(
    run_a_dir: os.PathLike | str,
    run_b_dir: os.PathLike | str,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, dict[str, Bootstrap]]:
    """Paired bootstrap of run B against run A, per set both runs have and per shared metric.

    Items are paired by id (sorted, so the result does not depend on file order).

    Returns:
      `{set name: {metric: Bootstrap}}`, sets in run A's order (an empty mapping for a set
      neither run finished an item of).

    Raises:
      SetVersionError: a set was evaluated at different versions (both named).
      ValueError: the runs did not finish the same items of a set (the missing ids named), or
        an item lacks a metric's score.
    """
    sum_a, sum_b = load_summary(run_a_dir), load_summary(run_b_dir)
    judge_a, judge_b = sum_a["run"].get("judge"), sum_b["run"].get("judge")
    if judge_a != judge_b:
        raise SetVersionError(
            f"{run_a_dir} was scored by the judge {judge_a} but {run_b_dir} by {judge_b}; runs "
            "compare only under the same Final Evaluation Judge"
        )
    out: dict[str, dict[str, Bootstrap]] = {}
    for name, entry_a in sum_a["sets"].items():
        entry_b = sum_b["sets"].get(name)
        if entry_b is None:
            continue
        if entry_a["version"] != entry_b["version"]:
            raise SetVersionError(
                f"set {name!r}: {run_a_dir} evaluated version {entry_a['version']} but "
                f"{run_b_dir} evaluated {entry_b['version']}; runs on different versions of "
                "a set are not comparable"
            )
        scores_a, scores_b = read_scores(run_a_dir, name), read_scores(run_b_dir, name)
        only_a, only_b = scores_a.keys() - scores_b.keys(), scores_b.keys() - scores_a.keys()
        if only_a or only_b:
            parts = [_ids_missing(list(o), r) for o, r in ((only_a, run_a_dir),
                                                           (only_b, run_b_dir)) if o]  # fmt: skip
            raise ValueError(
                f"set {name!r}: the runs did not finish the same items ({'; '.join(parts)})"
            )
        ids = sorted(scores_a)
        if not ids:
            out[name] = {}  # nothing finished in either run: nothing to compare
            continue
        metrics = [m for m in entry_a["metrics"] if m in entry_b["metrics"]]
        weights = read_weights(run_b_dir, name)
        out[name] = {
            m: paired_bootstrap(
                metric_scores(scores_a, m, ids, f"{run_a_dir} set {name!r}"),
                metric_scores(scores_b, m, ids, f"{run_b_dir} set {name!r}"),
                resamples=resamples,
                seed=seed,
                confidence=confidence,
                weights=item_weights(weights, m, ids),
            )
            for m in metrics
        }
    return out
