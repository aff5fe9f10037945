"""The evolution report's failure clusters (`failures.json` in a report directory), as the
viewer reads them: which clusters there are and which run entries are their examples.

The file's contract (format 1): `{"format": 1, "harness_version", "eval_run_dir", "clusters":
[{"id", "category", "cause", "count", "share", "examples": [{"run_dir", "set", "item_id"}]}],
"stopping_rule"}`. A report that breaks it is shown as a problem naming the field, never as a
crash; examples whose run is not loaded or whose item is missing are counted, not hidden.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

FAILURES_FILE = "failures.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cluster:
    id: str
    category: str
    cause: str
    count: int
    share: float
    examples: tuple[tuple[pathlib.Path, str, str], ...]  # (resolved run dir, set, item id)


@dataclasses.dataclass(kw_only=True)
class Report:
    path: pathlib.Path
    harness_version: str
    eval_run_dir: str
    stopping_rule: str | None
    clusters: list[Cluster]
    problems: list[str]

    def run_dirs(self) -> list[pathlib.Path]:
        """Every run the report points at (its evaluation run first), each once."""
        dirs = [_resolve(self.path, self.eval_run_dir)] if self.eval_run_dir else []
        for c in self.clusters:
            dirs += [d for d, _, _ in c.examples]
        return list(dict.fromkeys(dirs))


def _resolve(report_dir: pathlib.Path, run_dir: str) -> pathlib.Path:
    """A run dir as written in the report: absolute, or relative to the working directory
    (the diagnosing process's), else to the report's folder."""
    path = pathlib.Path(run_dir)
    if not path.is_absolute() and not path.exists() and (report_dir / path).exists():
        path = report_dir / path
    return path.resolve()


def read_report(report_dir: pathlib.Path | str) -> Report:
    report_dir = pathlib.Path(report_dir)
    file = report_dir / FAILURES_FILE
    report = Report(path=report_dir, harness_version="", eval_run_dir="", stopping_rule=None,
                    clusters=[], problems=[])  # fmt: skip
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        report.problems.append(f"{file}: cannot be read ({err})")
        return report
    if not isinstance(data, dict) or data.get("format") != 1:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        report.problems.append(f"{file}: format {got!r} is not 1")
        return report
    report.harness_version = str(data.get("harness_version") or "")
    report.eval_run_dir = str(data.get("eval_run_dir") or "")
    rule = data.get("stopping_rule")
    report.stopping_rule = None if rule is None else str(rule)
    for k, raw in enumerate(data.get("clusters") or []):
        try:
            report.clusters.append(_cluster(report_dir, raw))
        except (TypeError, ValueError, KeyError) as err:
            report.problems.append(f"{file}: clusters[{k}] skipped ({err})")
    return report


def _cluster(report_dir: pathlib.Path, raw: Any) -> Cluster:
    if not isinstance(raw, dict):
        raise TypeError(f"a {type(raw).__name__}, not an object")
    examples = []
    for e in raw.get("examples") or []:
        examples.append((_resolve(report_dir, str(e["run_dir"])), str(e["set"]), str(e["item_id"])))
    return Cluster(
        id=str(raw["id"]), category=str(raw.get("category", "")), cause=str(raw.get("cause", "")),
        count=int(raw.get("count", len(examples))), share=float(raw.get("share", 0.0)),
        examples=tuple(examples),
    )  # fmt: skip
