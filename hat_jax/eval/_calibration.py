"""Calibration of the LLM judge panel against human labels (paper E.1/E.3).

Human labels are a JSONL or CSV file with the columns `item_id`, `dimension` and `label`:
Accuracy labels are 0/1, Effectiveness labels 0/0.5/1 (the scale the judges answer on, see
`rl.rewards._judge.parse_vote`). `judge_predictions` turns the panel's verdicts into the same
shape, one mapping for the panel's majority label (key `"panel"`) and one per judge;
`calibration_report` measures each against the human labels: agreement, Cohen's kappa and
the confusion matrix (rows: human label, columns: judge label), per dimension.
`run_predictions` reads them from an evaluation run (T1/T2 records keep the rule scorer's
labels, as the judge `"rules"`, and, when a panel scored the run, every vote), so the rule
scorer is calibrated the same way as the panel.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from hat_jax import files
from hat_jax.metrics import cohen_kappa, confusion_matrix
from rl.rewards._judge import JudgeVote, PanelVerdict

RULES = "rules"

PANEL = "panel"
DIMENSIONS: dict[str, tuple[float, ...]] = {
    "accuracy": (0.0, 1.0),
    "effectiveness": (0.0, 0.5, 1.0),
}
COLUMNS = ("item_id", "dimension", "label")

Key = tuple[str, str]  # (item id, dimension)
Labels = dict[Key, float]


def _rows(path: pathlib.Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    suffix = path.suffix.lower()
    with open(path, encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ValueError(f"{path}:1: header lacks column(s) {missing}")
            for row in reader:
                yield reader.line_num, row
        elif suffix in (".jsonl", ".json"):
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as err:
                    raise ValueError(f"{path}:{n}: not valid JSON: {err}") from err
                if not isinstance(row, Mapping):
                    raise ValueError(f"{path}:{n}: expected a JSON object, got {row!r:.80}")
                yield n, row
        else:
            raise ValueError(f"{path}: human labels must be a .jsonl or .csv file")


def check_label(dimension: str, label: Any) -> float:
    """`label` as a float on `dimension`'s scale.

    Raises:
      ValueError: the dimension is unknown or the label not on its scale (both named).
    """
    if dimension not in DIMENSIONS:
        raise ValueError(f"unknown dimension {dimension!r} (one of {sorted(DIMENSIONS)})")
    scale = DIMENSIONS[dimension]
    try:
        value = float(label)
    except (TypeError, ValueError):
        value = None
    if isinstance(label, bool) or value not in scale:
        raise ValueError(
            f"{dimension} label {label!r} out of range (one of {', '.join(f'{x:g}' for x in scale)})"
        )
    return value


def read_labels(path: os.PathLike | str) -> Labels:
    """Human labels from a JSONL or CSV file: `{(item_id, dimension): label}`.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: naming the file and line: a missing column, an unknown dimension, a label
        out of range, or an (item, dimension) labelled twice.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no human labels at {path}")
    out: Labels = {}
    first: dict[Key, int] = {}
    for line, row in _rows(path):
        missing = [c for c in COLUMNS if row.get(c) in (None, "")]
        if missing:
            raise ValueError(f"{path}:{line}: missing {', '.join(missing)}")
        item_id, dimension = str(row["item_id"]).strip(), str(row["dimension"]).strip()
        try:
            label = check_label(dimension, row["label"])
        except ValueError as err:
            raise ValueError(f"{path}:{line}: item {item_id!r}: {err}") from None
        key = (item_id, dimension)
        if key in out:
            raise ValueError(
                f"{path}:{line}: item {item_id!r} has a second {dimension} label "
                f"(first on line {first[key]})"
            )
        out[key], first[key] = label, line
    return out


def judge_predictions(verdicts: Mapping[str, PanelVerdict]) -> dict[str, Labels]:
    """The panel's and each judge's labels from `{item id: PanelVerdict}`.

    Abstentions (a judge's invalid answer, or a panel with no valid vote) are left out.

    Returns:
      `{"panel": {(item_id, dimension): label}, <judge>: {...}, ...}`, judges sorted by name.

    Raises:
      ValueError: a judge is named "panel".
    """
    panel: Labels = {}
    judges: dict[str, Labels] = {}
    for item_id, verdict in verdicts.items():
        for dim in DIMENSIONS:
            if getattr(verdict, dim) is not None:
                panel[(item_id, dim)] = float(getattr(verdict, dim))
        for vote in verdict.votes:
            if vote.judge == PANEL:
                raise ValueError(f"a judge may not be named {PANEL!r} (item {item_id!r})")
            labels = judges.setdefault(vote.judge, {})
            for dim in DIMENSIONS:
                if vote.error is None and getattr(vote, dim) is not None:
                    labels[(item_id, dim)] = float(getattr(vote, dim))
    return {PANEL: panel, **dict(sorted(judges.items()))}


def run_predictions(run_dir: os.PathLike | str, set_name: str) -> dict[str, Labels]:
    """The labels an evaluation run gave a set's items: `"rules"` (the rule scorer), and
    `"panel"` plus one entry per judge when the Final Evaluation Judge scored the run.

    Raises:
      ValueError: the set's records carry no labels (not a T1/T2 set, or not evaluated).
    """
    from hat_jax.eval._run import read_items

    rules: Labels = {}
    verdicts: dict[str, PanelVerdict] = {}
    for record in read_items(run_dir, set_name):
        details = record.get("details") or {}
        for dim in DIMENSIONS:
            if dim in details.get(RULES, {}):
                rules[(record["id"], dim)] = float(details[RULES][dim])
        judged = details.get("judge")
        if judged:
            verdicts[record["id"]] = PanelVerdict(
                accuracy=judged["accuracy"],
                effectiveness=judged["effectiveness"],
                votes=tuple(JudgeVote(**v) for v in judged["votes"]),
            )
    if not rules:
        raise ValueError(
            f"{run_dir}: the items of set {set_name!r} carry no Accuracy/Effectiveness labels "
            "(calibrate a T1 or T2 set of a finished run)"
        )
    return {**(judge_predictions(verdicts) if verdicts else {}), RULES: rules}


def _measure(pairs: list[tuple[float, float]], scale: tuple[float, ...]) -> dict[str, Any]:
    matrix = confusion_matrix(pairs, scale)
    n = int(matrix.sum())
    return {
        "n": n,
        "agreement": float(np.trace(matrix) / n) if n else None,
        "kappa": cohen_kappa(matrix),
        "labels": list(scale),
        "confusion": matrix.tolist(),
    }


def calibration_report(
    human: Mapping[Key, float], predicted_by_judge: Mapping[str, Mapping[Key, float]]
) -> dict[str, Any]:
    """Agreement of the panel and each judge with the human labels, per dimension.

    Args:
      human: `{(item_id, dimension): label}` (from `read_labels`).
      predicted_by_judge: `{name: {(item_id, dimension): label}}` (from `judge_predictions`);
        only items with a human label count.

    Returns:
      `{"human": {dimension: count}, dimension: {name: {"n", "agreement", "kappa", "labels",
      "confusion", "unlabelled"}}}`: `confusion[i][j]` counts items the human labelled
      `labels[i]` and the judge `labels[j]`; `unlabelled` counts human-labelled items the judge
      gave no label (abstentions). The panel comes first, then the judges in the given order.

    Raises:
      ValueError: a label is not on its dimension's scale (judge and item named).
    """
    for (item_id, dim), label in human.items():
        try:
            check_label(dim, label)
        except ValueError as err:
            raise ValueError(f"human label of item {item_id!r}: {err}") from None
    report: dict[str, Any] = {
        "human": {d: sum(k[1] == d for k in human) for d in DIMENSIONS},
    }
    names = sorted(predicted_by_judge, key=lambda j: j != PANEL)  # stable: panel first
    for dim, scale in DIMENSIONS.items():
        report[dim] = {}
        keys = [k for k in human if k[1] == dim]
        for name in names:
            predicted = predicted_by_judge[name]
            pairs = []
            for key in keys:
                if key in predicted:
                    try:
                        pairs.append((human[key], check_label(dim, predicted[key])))
                    except ValueError as err:
                        raise ValueError(f"judge {name!r}, item {key[0]!r}: {err}") from None
            report[dim][name] = {**_measure(pairs, scale), "unlabelled": len(keys) - len(pairs)}
    return report


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def write_calibration(path: os.PathLike | str, report: Mapping[str, Any]) -> pathlib.Path:
    """Writes the calibration report as Markdown, atomically; returns the path."""
    counts = ", ".join(f"{n} {d}" for d, n in report["human"].items())
    lines = ["# Judge calibration against human labels", "", f"Human labels: {counts}.", ""]
    for dim in DIMENSIONS:
        lines += [f"## {dim}", ""]
        lines += ["| judge | n | agreement | kappa | no label |", "|---|---|---|---|---|"]
        for name, m in report[dim].items():
            lines.append(
                f"| {name.replace('|', '/')} | {m['n']} | {_fmt(m['agreement'])} | {_fmt(m['kappa'])} "
                f"| {m['unlabelled']} |"
            )
        lines.append("")
        for name, m in report[dim].items():
            labels = [f"{x:g}" for x in m["labels"]]
            lines += [f"Confusion, {name} (rows: human, columns: judge):", ""]
            lines += ["| human \\ judge | " + " | ".join(labels) + " |"]
            lines += ["|---" * (len(labels) + 1) + "|"]
            for label, row in zip(labels, m["confusion"]):
                lines.append(f"| {label} | " + " | ".join(str(c) for c in row) + " |")
            lines.append("")
    return files.write_text(path, "\n".join(lines))
