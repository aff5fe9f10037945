"""The first section of a pipeline's `report.md`: what the final policy does, from the files
the stages wrote (the evaluation's items and summary, SFT's metrics, RL's and MTP's
summaries), so every figure there is this run's and nothing is copied by hand.

- the final policy on T1 (and T2 where evaluated): Accuracy, Effectiveness, AVG with its 95%
  bootstrap interval over items, Skill Selection and Tool Rationality, and T1 per family;
- SFT's learning curve: dev loss, the Skill named (teacher-forced) and the tool chosen at
  each evaluation;
- RL's held-out change with its paired interval, MTP's acceptance;
- a few of the final policy's T1 episodes that answered the comment (Effectiveness 1).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

_QA = ("t1", "t2")
_EXAMPLES = 3


def _read_json(path: pathlib.Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _qa_lines(run_dir: pathlib.Path) -> list[str]:
    from hat_jax import eval as hev

    summary = _read_json(run_dir / "summary.json")
    if summary is None:
        return []
    lines = []
    for name in _QA:
        s = summary["sets"].get(name)
        if not s:
            continue
        items = hev.read_items(run_dir, name)
        m = {k: 100 * v for k, v in s["metrics"].items()}
        ci = hev.mean_interval([100 * i["scores"]["avg"] for i in items]) if items else None
        interval = f" (95% interval {ci.low:.1f} to {ci.high:.1f})" if ci else ""
        lines.append(
            f"- **{name.upper()}** ({s['n']} items, live room {summary['run'].get('room', 'v0')}"
            f"): AVG **{m['avg']:.1f}**{interval}, Accuracy {m['accuracy']:.1f}, Effectiveness "
            f"**{m['effectiveness']:.1f}**, Skill Selection {m['skill_selection']:.1f}, Tool "
            f"Rationality {m['tool_rationality']:.1f}"
        )
        if name == "t1" and s.get("families"):
            per = ", ".join(
                f"{f} {100 * v['avg']:.0f}/{100 * v['effectiveness']:.0f}"
                for f, v in s["families"].items()
            )
            lines.append(f"  - per family (AVG/Effectiveness): {per}")
    return lines


def _sft_curve(root: pathlib.Path) -> list[str]:
    from hat_jax.metrics import read_metrics

    path = root / "sft"
    if not (path / "metrics.jsonl").is_file():
        return []
    rows = [r for r in read_metrics(path) if "eval/loss" in r]
    if not rows:
        return []

    def pct(r, key):
        v = r.get(key)
        return "" if v is None or v != v else f"{100 * v:.1f}%"

    out = ["", "| SFT step | dev loss | Skill named | tool chosen | tool named in the reasoning |",
           "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['step']} | {r['eval/loss']:.3f} | {pct(r, 'eval/skill_decision')} | "
                   f"{pct(r, 'eval/tool_choice')} | {pct(r, 'eval/tool_decision')} |")  # fmt: skip
    return [*out, ""]


def _rl_line(root: pathlib.Path) -> list[str]:
    summary = _read_json(root / "rl" / "rl_summary.json") or {}
    c = (summary.get("change") or {}).get("mean")
    if not c:
        return []
    return [f"- HSA-RL, held-out reward (mean of four, {c['n']} greedy episodes): "
            f"{c['before']:.3f} -> {c['after']:.3f}, change {c['delta']:+.3f} (95% interval "
            f"{c['low']:+.3f} to {c['high']:+.3f})"]  # fmt: skip


def _example(record: dict[str, Any]) -> list[str]:
    t = record.get("trajectory") or {}
    comments = " / ".join(c.get("text", "") for c in t.get("request", {}).get("comments", []))
    lines = [f"**{record['id']}** ({record['family']}); viewer: *{comments}*", ""]
    for call in t.get("model_calls", []):
        out = call.get("output") or {}
        calls = ", ".join(
            f"`{c['function']['name']}` {json.dumps(c['function']['arguments'], ensure_ascii=False)}"
            for c in out.get("tool_calls") or []
        )
        reasoning = (out.get("reasoning") or "").strip()
        lines.append(f"- round {call.get('round')}: {reasoning} -> {calls or out.get('content')}")
    return [*lines, f"- reply: {record.get('output')}", ""]


def _examples(run_dir: pathlib.Path) -> list[str]:
    from hat_jax import eval as hev

    good = [r for r in hev.read_items(run_dir, "t1") if r["scores"].get("effectiveness") == 1.0]
    seen, picked = set(), []
    for r in good:  # one per family first
        if r["family"] not in seen:
            seen.add(r["family"])
            picked.append(r)
    if not picked:
        return []
    out = [f"Episodes of the final policy that answered the comment ({len(good)} of T1's items "
           "had Effectiveness 1):", ""]  # fmt: skip
    for r in picked[:_EXAMPLES]:
        out += _example(r)
    return out


def outcome_lines(root: pathlib.Path, manifest: dict[str, Any]) -> list[str]:
    """The section's lines ([] until the evaluation stage has written its summary)."""
    entry = manifest["entries"].get("eval", {})
    summary = entry.get("outputs", {}).get("summary")
    if entry.get("status") != "complete" or not summary:
        return []
    run_dir = pathlib.Path(summary).parent
    lines = ["## What the final policy does", ""]
    lines += _qa_lines(run_dir) + _rl_line(root)
    mtp = manifest["entries"].get("mtp", {}).get("result", {}).get("summary", [])
    lines += [f"- MTP: {line}" for line in mtp if "acceptance" in line][:1]
    lines += _sft_curve(root) + _examples(run_dir)
    return [*lines, ""]
