"""Failure diagnosis: the failed items of an evaluation run, clustered by category and cause.

A failure is an item whose headline score (`avg`) is below 1. Its category is the item's
family; its cause is the first of these the record shows (so a Skill that is missing, a Hook
that refused the needed tool, or a tool that failed is named before the reward it cost):

    skill unavailable: <skill>        the policy could not load a Skill the item needs
    hook <hook>: <subject>            a Hook blocked or sent back the policy's call or reply
    tool <error>: <tool>              a tool call failed (not_allowed, invalid_arguments, ...)
    fault <kind>                      the loop's faults (policy_error, max_rounds, ...)
    judge <dimension>: <reason>       the Final Evaluation Judge's reason (a judged run)
    <dimension>: <reason>             the rule reward's reason (numbers and ids removed)

The report (`failures.json`, read by other tools, so its keys are fixed, and `failures.md`):

    {"format": 1, "harness_version": str, "eval_run_dir": str,
     "clusters": [{"id": "c1", "category": str, "cause": str, "count": int, "share": float,
                   "examples": [{"run_dir": str, "set": str, "item_id": str}]}],
     "stopping_rule": str | null}

`share` is the cluster's count over the items evaluated. A results file with a line that does not
parse is diagnosed from its other lines, and the bad line is named in `failures.md` and in
`bad_lines` of the return value.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import files
from hat_jax import harness as hx
from hat_jax.evolve import _registry as reg

FORMAT = 1
METRIC = "avg"
EXAMPLES = 3
DIMENSIONS = ("accuracy", "effectiveness", "tool_rationality", "skill_selection")
_MISSING_SKILL = re.compile(r"missing one of \[([^\]]*)\]")


def _checked(rec: dict[str, Any]) -> dict[str, Any]:
    """An item record with what diagnosis reads (KeyError/TypeError/ValueError otherwise)."""
    float(rec["scores"][METRIC]), rec["id"], rec["set"], rec["family"]
    return rec


def read_records(run_dir: os.PathLike | str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every parseable item record of a run (all sets), and one line per bad line
    (`<file>:<line>: <why>`)."""
    records, bad = [], []
    for path in sorted((pathlib.Path(run_dir) / "items").glob("*.jsonl")):
        records += files.read_jsonl(path, _checked, what="evaluation result", problems=bad)
    return records, bad


def _normalize(reason: str) -> str:
    reason = re.sub(r"\bi\d+(\.f\d+)?\b", "#", reason)
    return re.sub(r"\d+(\.\d+)?", "N", reason).strip()


def cause(record: Mapping[str, Any]) -> str:
    """The cause of one failed item (see the module docstring)."""
    traj = record.get("trajectory") or {}
    details = record.get("details") or {}
    reasons = details.get("reasons") or {}
    faults = traj.get("faults") or []
    if any(f.get("kind") == "policy_error" for f in faults):
        for reason in reasons.get("skill_selection", []):
            if m := _MISSING_SKILL.search(reason):
                first = m.group(1).split(",")[0].strip(" '\"")
                return f"skill unavailable: {first}"
    # Names on canonical names, so a cluster gathers T1 and T2 runs (renamed tools, Skills).
    renames = hx.RenameMap.from_dict(traj.get("renames") or {})
    for event in traj.get("hook_events") or []:
        if event.get("outcome") in ("block", "retry"):
            subject = event.get("subject") or event.get("point")
            subject = renames.canonical_skill(renames.canonical_tool(subject))
            return f"hook {event['hook']}: {subject}"
    for call in traj.get("tool_calls") or []:
        if call.get("error"):
            return f"tool {call['error']}: {call.get('canonical') or call.get('name')}"
    if faults:
        return f"fault {faults[0].get('kind')}"
    scores = record.get("scores", {})
    judged = details.get("judge") or {}
    for dim in DIMENSIONS:
        if float(scores.get(dim, 1.0)) >= 1.0:
            continue
        votes = [v for v in judged.get("votes", []) if v.get("reason")]
        if dim in ("accuracy", "effectiveness") and votes:
            return f"judge {dim}: {_normalize(votes[0]['reason'])[:120]}"
        if reasons.get(dim):
            return f"{dim}: {_normalize(reasons[dim][0])[:120]}"
        return f"{dim} below 1"
    return "avg below 1"


def cluster(records: Sequence[Mapping[str, Any]], run_dir: str) -> list[dict[str, Any]]:
    """The failures of `records` grouped by (category, cause), largest first."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if float(r["scores"][METRIC]) < 1.0:
            groups.setdefault((r["family"], cause(r)), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    n = max(len(records), 1)
    return [
        {
            "id": f"c{k}",
            "category": category,
            "cause": why,
            "count": len(rows),
            "share": round(len(rows) / n, 4),
            "examples": [
                {"run_dir": run_dir, "set": r["set"], "item_id": r["id"]} for r in rows[:EXAMPLES]
            ],  # fmt: skip
        }
        for k, ((category, why), rows) in enumerate(ordered, 1)
    ]


def stopping_rule(
    clusters: Sequence[Mapping[str, Any]], evolve_dir: os.PathLike | str | None, max_share: float
) -> str | None:
    """The stopping line, when the failures are sparse (no cluster above `max_share`) and the
    last evaluated edit regressed a category; None otherwise."""
    if not clusters or any(c["share"] > max_share for c in clusters):
        return None
    evaluated = (
        [e for e in reg.history(evolve_dir) if e["event"] == "evaluated"] if evolve_dir else []
    )
    if not evaluated or not evaluated[-1].get("regressions"):
        return None
    last = evaluated[-1]
    return (
        f"stop: the {sum(c['count'] for c in clusters)} remaining failures are sparse long-tail "
        f"cases (no cluster above {max_share:.0%} of items) and the last edit "
        f"({last['candidate']}) regressed {', '.join(last['regressions'])}: further local rules "
        "are likely to do more harm than good"
    )


def diagnose(
    run_dir: os.PathLike | str,
    out_dir: os.PathLike | str,
    *,
    evolve_dir: os.PathLike | str | None = None,
    max_share: float = 0.03,
) -> dict[str, Any]:
    """Clusters the failures of the evaluation run `run_dir` and writes the failure report.

    Args:
      run_dir: an evaluation run (`hat_jax.eval.evaluate`'s folder).
      out_dir: where `failures.json` and `failures.md` go.
      evolve_dir: the evolution folder (its history feeds the stopping rule).
      max_share: a cluster above this share of the items is systematic, not long tail.

    Returns:
      The report, plus `bad_lines` (results lines that did not parse) and `items`.

    Raises:
      FileNotFoundError: `run_dir` holds no results at all.
    """
    run_dir, out_dir = pathlib.Path(run_dir), pathlib.Path(out_dir)
    records, bad = read_records(run_dir)
    if not records and not bad:
        raise FileNotFoundError(f"{run_dir} holds no evaluation results (items/*.jsonl)")
    clusters = cluster(records, str(run_dir))
    report = {
        "format": FORMAT,
        "harness_version": _harness_version(run_dir),
        "eval_run_dir": str(run_dir),
        "clusters": clusters,
        "stopping_rule": stopping_rule(clusters, evolve_dir, max_share),
    }
    files.write_json(out_dir / "failures.json", report)
    files.write_text(out_dir / "failures.md", render(report, records, bad))
    return {**report, "bad_lines": bad, "items": len(records)}


def _harness_version(run_dir: pathlib.Path) -> str:
    try:
        run = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["run"]
        return str(run.get("version") or run["harness"])
    except (OSError, ValueError, KeyError):
        return "unknown"


def trajectory_lines(record: Mapping[str, Any]) -> list[str]:
    traj = record.get("trajectory") or {}
    lines = [
        f"  - comments: {[c.get('text') for c in traj.get('request', {}).get('comments', [])]}"
    ]
    lines += [f"  - skill loaded: {s}" for s in traj.get("loaded_skills", [])]
    for c in traj.get("tool_calls", []):
        lines.append(f"  - tool {c.get('name')}({json.dumps(c.get('arguments'))[:80]})"
                     + (f" -> error {c['error']}" if c.get("error") else ""))  # fmt: skip
    lines += [f"  - hook {e['hook']} {e['outcome']}: {e.get('detail', '')[:100]}"
              for e in traj.get("hook_events", []) if e.get("outcome") in ("block", "retry")]  # fmt: skip
    lines += [f"  - fault {f['kind']}: {f.get('detail', '')[:100]}" for f in traj.get("faults", [])]
    lines.append(f"  - reply: {record.get('output', '')[:200]!r}")
    return lines


def render(
    report: Mapping[str, Any], records: Sequence[Mapping[str, Any]], bad: Sequence[str]
) -> str:
    """`failures.md`: the clusters, examples with their trajectories, the stopping rule."""
    by_key = {(r["set"], r["id"]): r for r in records}
    failed = sum(c["count"] for c in report["clusters"])
    out = [
        f"# Failure report: Harness {report['harness_version']}",
        "",
        f"Run `{report['eval_run_dir']}`: {failed} failures of {len(records)} items, "
        f"{len(report['clusters'])} clusters.",
        "",
        "| cluster | category | cause | count | share |",
        "|---|---|---|---|---|",
    ]
    out += [f"| {c['id']} | {c['category']} | {c['cause']} | {c['count']} | {c['share']:.1%} |"
            for c in report["clusters"]]  # fmt: skip
    out += ["", f"Stopping rule: {report['stopping_rule'] or 'not met'}", ""]
    if bad:
        out += ["## Unreadable results lines (skipped)", ""] + [f"- {b}" for b in bad] + [""]
    for c in report["clusters"]:
        out += [f"## {c['id']}: {c['category']} / {c['cause']}", ""]
        for ex in c["examples"]:
            out.append(f"- {ex['set']} `{ex['item_id']}`")
            out += trajectory_lines(by_key[(ex["set"], ex["item_id"])])
        out.append("")
    return "\n".join(out)
