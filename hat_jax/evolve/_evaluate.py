"""The loop's two measured steps: diagnose the current version, evaluate a proposal against it.

Runs live in `<evolve_dir>/runs/<version>/<key>/` (`key`: the dev sets' versions, the
policy and the judge), so a version is run once per dev split and policy and later steps reuse it. An
evaluation writes `evaluation.json` and `evaluation.md` (per-category deltas with paired
bootstrap intervals, every regressing category flagged even when the total improves) and adds an
`evaluated` event to the history; the stopping rule reads the last one.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from hat_jax import eval as hev
from hat_jax import files
from hat_jax import harness as hx
from hat_jax.evolve import _diagnose, _runs
from hat_jax.evolve import _registry as reg

RUNS = "runs"
EVALUATIONS = "evaluations"


def run_dir_for(evolve_dir, version: str, policy: hev.EvalPolicy, split: _runs.DevSplit):
    """Where `version` is run on `split` by `policy`."""
    ref = _runs.reference_context(evolve_dir)
    judge = dataclasses.replace(ref, judge=split.judge).describe_judge()
    key = hx.content_hash([[s.version for s in _runs.dev_sets(split, ref)], policy.description,
                           judge])[:12]  # fmt: skip
    return pathlib.Path(evolve_dir) / RUNS / version / key


def run(evolve_dir, version: str, policy: hev.EvalPolicy, split: _runs.DevSplit) -> pathlib.Path:
    """Runs `version` on the dev split (resuming or reusing a finished run); its folder."""
    run_dir = run_dir_for(evolve_dir, version, policy, split)
    _runs.run_version(evolve_dir, version, policy, split=split, run_dir=run_dir)
    return run_dir


def diagnose(
    evolve_dir: os.PathLike | str,
    policy: hev.EvalPolicy,
    split: _runs.DevSplit,
    out_dir: os.PathLike | str,
    *,
    version: str | None = None,
    max_share: float = 0.03,
) -> dict[str, Any]:
    """Runs the current version (or `version`) on the dev split and writes its failure report."""
    version = version or reg.current(evolve_dir)
    run_dir = run(evolve_dir, version, policy, split)
    return _diagnose.diagnose(run_dir, out_dir, evolve_dir=evolve_dir, max_share=max_share)


def evaluate(
    evolve_dir: os.PathLike | str,
    candidate: str,
    policy: hev.EvalPolicy,
    split: _runs.DevSplit,
    *,
    out_dir: os.PathLike | str | None = None,
    tolerance: float = 0.0,
) -> dict[str, Any]:
    """Runs `candidate` and the current version on the dev split and compares them.

    Returns:
      `{"candidate", "baseline", "runs", "total", "categories", "regressions", "dir"}`.
    """
    baseline = reg.current(evolve_dir)
    runs = {v: run(evolve_dir, v, policy, split) for v in (baseline, candidate)}
    result = _runs.compare(runs[baseline], runs[candidate], _set_names(runs[baseline]),
                           tolerance=tolerance)  # fmt: skip
    out = pathlib.Path(
        out_dir or pathlib.Path(evolve_dir) / EVALUATIONS / f"{candidate}-vs-{baseline}"
    )
    data = {"candidate": candidate, "baseline": baseline,
            "runs": {"baseline": str(runs[baseline]), "candidate": str(runs[candidate])},
            **result}  # fmt: skip
    files.write_json(out / "evaluation.json", data)
    files.write_text(out / "evaluation.md", render(data))
    reg.record(evolve_dir, {"event": "evaluated", "candidate": candidate, "baseline": baseline,
                            "delta": result["total"]["delta"],
                            "regressions": result["regressions"], "evidence": str(out)})  # fmt: skip
    return {**data, "dir": str(out)}


def _set_names(run_dir: pathlib.Path) -> list[str]:
    return sorted(hev.read_summary(run_dir)["sets"])


def _row(name: str, b: Mapping[str, Any]) -> str:
    flag = " REGRESSED" if b.get("regressed") else ""
    return (f"| {name} | {b['n']} | {100 * b['mean_a']:.1f} | {100 * b['mean_b']:.1f} | "
            f"{100 * b['delta']:+.1f} [{100 * b['low']:+.1f}, {100 * b['high']:+.1f}] |{flag} |")  # fmt: skip


def render(data: Mapping[str, Any]) -> str:
    """`evaluation.md`: the total and each category, regressions flagged."""
    lines = [
        f"# Evaluation: {data['candidate']} against the current {data['baseline']}",
        "",
        "Headline score `avg` (x100); delta with its 95% paired bootstrap interval.",
        "",
        "| category | n | current | candidate | delta [95% CI] | flag |",
        "|---|---|---|---|---|---|",
        _row("**total**", data["total"]),
    ]
    lines += [_row(k, v) for k, v in data["categories"].items()]
    regressions = data["regressions"]
    lines += ["", f"Regressing categories: {', '.join(regressions) if regressions else 'none'}"]
    return "\n".join(lines) + "\n"
