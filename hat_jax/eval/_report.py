"""The Markdown report of an evaluation run, with PNG plots and optional baseline comparisons.

`write_report(run_dir)` reads the run's `summary.json` and `items/<set>.jsonl` and writes
`<run>/report.md`: the run record (policy, checkpoint, live room, Harness version, sampling,
set versions; a run recorded before rooms existed was in the v0 room), per set a table of its
metrics (scores x100, one decimal, with a bootstrap interval of the mean), a table per
family and, for agent sets, the names the policy wrote for tools and Skills (copied from a
renamed list or memorised: `hat_jax.eval._names`), and `plots/<set>.png` with each metric's
mean and interval. With `baseline_dir`, each set both runs evaluated is also compared item
by item (paired bootstrap: delta, its interval and P(delta <= 0)), and the plots show both
runs side by side.
Every file is written atomically.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax import files
from hat_jax.eval._items import DEFAULT_ROOM
from hat_jax.eval._names import names_table
from hat_jax.eval._stats import (
    Bootstrap,
    Interval,
    compare_runs,
    item_weights,
    load_summary,
    mean_interval,
    metric_scores,
    read_scores,
    read_weights,
)
from hat_jax.metrics._plots import PLOTS_DIR, _figure, _save

REPORT_FILE = "report.md"
_NAMES_NOTE = (
    "Names written (every tool call and Skill load of the set's agent items): the renamed name "
    "the list shows, the training name of a tool or Skill the item renamed, a name it did not "
    "rename, or another; copy share = listed / (listed + training), x100."
)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}"


def _p(p: float, resamples: int) -> str:
    if p == 0:
        return f"< {1 / resamples:g}"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.4f}"


def _json(value: Any) -> str:
    if value is None:
        return "-"
    return f"`{json.dumps(value, ensure_ascii=False, sort_keys=True)}`"


def plot_name(set_name: str) -> str:
    """The file name of a set's plot (`<set>.png`, odd characters replaced)."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', set_name)}.png"


def set_intervals(
    run_dir: pathlib.Path, name: str, metrics: Sequence[str], resamples: int, seed: int
) -> dict[str, Interval]:
    """Bootstrap intervals of each metric's mean ({} when the run kept no item scores)."""
    scores = read_scores(run_dir, name)
    ids = list(scores)
    if not ids:
        return {}
    where, weights = f"{run_dir} set {name!r}", read_weights(run_dir, name)
    return {
        m: mean_interval(
            metric_scores(scores, m, ids, where),
            resamples=resamples,
            seed=seed,
            weights=item_weights(weights, m, ids),
        )  # fmt: skip
        for m in metrics
    }


def _record(summary: Mapping[str, Any], run_dir: pathlib.Path, title: str) -> list[str]:
    run = dict(summary["run"])
    config = dict(run.pop("config", None) or {})
    sampling = run.pop("sampling", None) or config.pop("sampling", None)
    lines = [
        f"- {title}: `{run_dir}`",
        f"- Policy: {_json(run.pop('policy', None))}",
        f"- Checkpoint: {_cell(run.pop('checkpoint', None) or '-')}",
        f"- Live room: {_cell(run.pop('room', None) or DEFAULT_ROOM)}",
        f"- Harness: {_cell(run.pop('harness', None) or '-')}",
        f"- Sampling: {_json(sampling)}",
        f"- Created: {_cell(run.pop('created', None) or '-')}",
    ]
    if config:
        lines.append(f"- Run config: {_json(config)}")
    lines += [f"- {_cell(key)}: {_json(value)}" for key, value in run.items()]
    sets = ", ".join(
        f"{name} `{entry['version']}` (n={entry.get('n', '-')})"
        for name, entry in summary["sets"].items()
    )
    return [*lines, f"- Sets: {sets or '(none)'}"]


def _set_table(entry: Mapping[str, Any], intervals: Mapping[str, Interval]) -> list[str]:
    n = entry.get("n", "-")
    lines = ["| metric | score | 95% interval | n |", "|---|---:|---|---:|"]
    for metric, mean in entry["metrics"].items():
        iv = intervals.get(metric)
        band = f"{_pct(iv.low)} – {_pct(iv.high)}" if iv else "-"
        lines.append(f"| {_cell(metric)} | {_pct(mean)} | {band} | {iv.n if iv else n} |")
    return lines


def _family_table(entry: Mapping[str, Any]) -> list[str]:
    families = entry.get("families") or {}
    if not families:
        return []
    metrics = list(entry["metrics"])
    lines = [
        "| family | n | " + " | ".join(_cell(m) for m in metrics) + " |",
        "|---|---:|" + "---:|" * len(metrics),
    ]
    for family, stats in sorted(families.items()):
        cells = [_pct(stats.get(m)) for m in metrics]
        lines.append(f"| {_cell(family)} | {stats.get('n', '-')} | " + " | ".join(cells) + " |")
    return lines


def _comparison_table(results: Mapping[str, Bootstrap], resamples: int) -> list[str]:
    lines = [
        "| metric | baseline | this run | delta | 95% interval | P(delta <= 0) | n |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for metric, r in results.items():
        lines.append(
            f"| {_cell(metric)} | {_pct(r.mean_a)} | {_pct(r.mean_b)} | {_signed(r.delta)} "
            f"| {_signed(r.low)} – {_signed(r.high)} | {_p(r.p_le_zero, resamples)} | {r.n} |"
        )
    return lines


def bar_plot(
    path: pathlib.Path,
    title: str,
    metrics: Sequence[str],
    runs: Sequence[tuple[str, Mapping[str, float], Mapping[str, Interval]]],
) -> None:
    """Grouped bars: one group per metric, one bar per run, with interval error bars."""
    fig, (ax,) = _figure(max(4.0, 1.1 * len(metrics) * len(runs) + 1.5), 3.6)
    width = 0.8 / len(runs)
    x = np.arange(len(metrics))
    for k, (label, means, intervals) in enumerate(runs):
        heights = np.array([100 * means.get(m, np.nan) for m in metrics])
        lows = np.array([100 * intervals[m].low if m in intervals else h
                         for m, h in zip(metrics, heights)])  # fmt: skip
        highs = np.array([100 * intervals[m].high if m in intervals else h
                          for m, h in zip(metrics, heights)])  # fmt: skip
        err = np.vstack([np.maximum(heights - lows, 0), np.maximum(highs - heights, 0)])
        pos = x + (k - (len(runs) - 1) / 2) * width
        bars = ax.bar(pos, heights, width * 0.92, yerr=err, capsize=3, label=label)
        ax.bar_label(bars, labels=[_pct(h / 100) for h in heights], padding=2, fontsize=8)
    long = max((len(m) for m in metrics), default=0) > 10
    ax.set_xticks(x, list(metrics), rotation=20 if long else 0, ha="right" if long else "center")
    ax.set_ylim(0, 110)
    ax.set_ylabel("score (x100)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if len(runs) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)


def write_report(
    run_dir: os.PathLike | str,
    *,
    baseline_dir: os.PathLike | str | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> pathlib.Path:
    """Writes `<run_dir>/report.md` and `<run_dir>/plots/<set>.png`; returns the report's path.

    Args:
      run_dir: the evaluation run (its `summary.json` and `items/`).
      baseline_dir: another run to compare with, item by item, on the sets both evaluated.
      resamples: bootstrap resamples for the intervals and comparisons.
      seed: the bootstrap's PCG64 seed.

    Raises:
      FileNotFoundError: a run has no summary.
      SetVersionError: the baseline evaluated another version of a shared set.
      ValueError: the runs did not finish the same items of a shared set.
    """
    run_dir = pathlib.Path(run_dir)
    summary = load_summary(run_dir)
    base = None if baseline_dir is None else pathlib.Path(baseline_dir)
    base_summary = load_summary(base) if base is not None else None
    compared = compare_runs(base, run_dir, resamples=resamples, seed=seed) if base else {}

    lines = [f"# Evaluation report: {run_dir.name}", "", "## Run", ""]
    lines += _record(summary, run_dir, "Run")
    if base_summary is not None:
        lines += ["", "Baseline:", ""] + _record(base_summary, base, "Baseline")
    lines += [
        "",
        f"Scores are x100, one decimal. Intervals are 95% percentile bootstrap intervals "
        f"({resamples} resamples of the items, seed {seed}); comparisons pair items by id "
        "(delta = this run - baseline; P(delta <= 0) is the share of resamples where this run "
        "does not beat the baseline).",
    ]
    for name, entry in summary["sets"].items():
        metrics = list(entry["metrics"])
        intervals = set_intervals(run_dir, name, metrics, resamples, seed)
        lines += [
            "",
            f"## {name}",
            "",
            f"Version `{entry['version']}`, {entry.get('n', '-')} items.",
            "",
        ]
        lines += _set_table(entry, intervals)
        if entry.get("policy_errors"):
            lines += ["", f"Policy errors (failed model calls): {entry['policy_errors']}."]
        family = _family_table(entry)
        if family:
            lines += ["", "By family:", "", *family]
        if entry.get("names"):
            lines += ["", _NAMES_NOTE, "", *names_table(entry["names"])]
        runs = [("this run", entry["metrics"], intervals)]
        if base_summary is not None:
            lines += ["", "### Against the baseline", ""]
            if name in compared and compared[name]:
                lines += _comparison_table(compared[name], resamples)
                base_entry = base_summary["sets"][name]
                base_intervals = set_intervals(base, name, metrics, resamples, seed)
                runs.insert(0, ("baseline", base_entry["metrics"], base_intervals))
            elif name in compared:
                lines.append("Neither run finished an item of this set.")
            else:
                lines.append("The baseline did not evaluate this set.")
        plot = run_dir / PLOTS_DIR / plot_name(name)
        bar_plot(plot, f"{name} ({entry['version']}, n={entry.get('n', '-')})", metrics, runs)
        lines += ["", f"![{name}]({PLOTS_DIR}/{plot.name})"]
    for name, reason in summary.get("skipped", {}).items():
        lines += ["", f"## {name}", "", f"Not evaluated: {reason}."]
    if base_summary is not None:
        only = [n for n in base_summary["sets"] if n not in summary["sets"]]
        if only:
            lines += ["", f"Sets only the baseline evaluated: {', '.join(only)}."]
    return files.write_text(run_dir / REPORT_FILE, "\n".join(lines) + "\n")
