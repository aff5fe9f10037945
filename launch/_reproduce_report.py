"""`<workdir>/report.md` of the miniature reproduction (`launch.reproduce`), rewritten atomically
with its manifest: the arms and their timings, the Table-3-style scores with intervals, the
paired comparisons, which of the paper's effects reproduce, and a plot."""

from __future__ import annotations

import pathlib
from typing import Any

from hat_jax import files

REPORT = "report.md"
PLOT = "plots/table3.png"
_VERDICTS = {"reproduces": "reproduces", "opposite": "**opposite**", "not shown": "not shown",
             "task not learned": "task not learned", "not run": "not run"}  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}"


def _finished(manifest: dict[str, Any]):
    """(arm, its entry, its evaluation run directory, its summary) of every finished arm."""
    from hat_jax.eval import read_summary

    for arm, entry in manifest["arms"].items():
        run = pathlib.Path(entry["eval"])
        if entry["status"] == "complete" and (run / "summary.json").is_file():
            yield arm, entry, run, read_summary(run)


def _scores(root: pathlib.Path, manifest: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Per finished arm: {set: Interval} of "avg" (bootstrap over the arm's own items)."""
    from hat_jax.eval import _report as eval_report

    c = manifest["config"]
    sets = [s.strip() for s in c["sets"].split(",") if s.strip()]
    out = {}
    for arm, _, run, summary in _finished(manifest):
        out[arm] = {s: eval_report.set_intervals(run, s, ["avg"], c["resamples"], c["seed"])["avg"]
                    for s in sets if s in summary["sets"]}  # fmt: skip
    return sets, out


def _table(manifest: dict[str, Any], sets: list[str], scores: dict[str, Any]) -> list[str]:
    rows = ["| arm | " + " | ".join(sets) + " |", "|---|" + "---:|" * len(sets)]
    for arm, entry in manifest["arms"].items():
        if arm not in scores:
            rows.append(f"| {entry['title']} | " + " | ".join(entry["status"] for _ in sets) + " |")
            continue
        cells = [f"{_pct(i.mean)} [{_pct(i.low)}, {_pct(i.high)}]" if (i := scores[arm].get(s))
                 else "-" for s in sets]  # fmt: skip
        rows.append(f"| {entry['title']} | " + " | ".join(cells) + " |")
    return rows


def _names(manifest: dict[str, Any], sets: list[str]) -> list[str]:
    """Per arm and set with renames: the tool and Skill names written, copied or memorised."""
    from hat_jax.eval._names import copy_share

    def cell(counts, kind):
        listed, training = counts.get(f"{kind}/listed", 0), counts.get(f"{kind}/training", 0)
        return f"{listed} / {training} ({_pct(copy_share(counts, kind))})"

    rows = []
    for _, entry, _, summary in _finished(manifest):
        for s in sets:
            counts = summary["sets"].get(s, {}).get("names") or {}
            if any(copy_share(counts, kind) is not None for kind in ("tool", "skill")):
                rows.append(f"| {entry['title']} | {s} | {cell(counts, 'tool')} | "
                            f"{cell(counts, 'skill')} |")  # fmt: skip
    if not rows:
        return []
    return ["## Names under renames", "",
            "The tool calls and Skill loads meant for a tool or Skill the item's Harness renamed: "
            "written by the renamed name the list shows (copied) / by the training name "
            "(memorised), and the copy share (x100). The HAT claim needs the first.", "",
            "| arm | set | tool calls listed / training (share) | Skill loads listed / training "
            "(share) |", "|---|---|---:|---:|", *rows, ""]  # fmt: skip


def _comparisons(manifest: dict[str, Any], sets: list[str]) -> list[str]:
    arms = manifest["arms"]
    rows = ["| B vs A | set | A | B | delta | 95% interval | P(delta <= 0) | n |",
            "|---|---|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for pair, by_set in manifest["comparisons"].items():
        a, b = pair.split("|")
        for s in sets:
            r = by_set.get(s)
            if r:
                rows.append(f"| {arms[b]['title']} vs {arms[a]['title']} | {s} | "
                            f"{_pct(r['mean_a'])} | {_pct(r['mean_b'])} | {_signed(r['delta'])} | "
                            f"{_signed(r['low'])} – {_signed(r['high'])} | {r['p_le_zero']:.3f} | "
                            f"{r['n']} |")  # fmt: skip
    return rows


def _effects(manifest: dict[str, Any]) -> list[str]:
    rows = ["| the paper's direction | set | delta (95% interval) | verdict |", "|---|---|---|---|"]
    for e in manifest["effects"]:
        r = e["result"]
        measured = f"{_signed(r['delta'])} ({_signed(r['low'])} – {_signed(r['high'])})" if r \
            else "-"  # fmt: skip
        if e.get("recovered_share") is not None:
            measured += f"; {100 * e['recovered_share']:.0f}% of the loss recovered"
        if e.get("effectiveness") and e["verdict"] == "task not learned":
            measured += "; Effectiveness " + " / ".join(_pct(x) for x in e["effectiveness"])
        if e["direction"] == "=":
            measured += f"; level means within ±{100 * e['margin']:.1f}" if "margin" in e else ""
        rows.append(f"| {e['effect']} | {e['set']} | {measured} | {_VERDICTS[e['verdict']]} |")
    return rows


def _edit_test(manifest: dict[str, Any]) -> list[str]:
    """The held-out Harness-edit test: dev errors per candidate, the frozen choice, held-out
    errors before and after per checkpoint."""
    t = manifest.get("edit_test")
    if not t:
        return []
    arms = manifest["arms"]
    titles = [arms[a]["title"] for a in t["arms"]]
    lines = ["## Held-out Harness-edit test (paper §5.5)", "",
             "An item is an error when the reply the viewer gets is not the policy's own reply "
             "worded as a live host speaks (`hat_jax.eval.host_wording`: no reply, the "
             "Harness's fallback, exposed machinery or uncertainty, markup). Candidate edits of "
             "the system prompt and Skills run on development cases (dev split) with each "
             "checkpoint; the one with the fewest errors is frozen and applied unchanged to "
             "held-out cases (test split).", "",
             "| edit on dev | " + " | ".join(f"{x} errors" for x in titles) + " |",
             "|---|" + "---:|" * len(titles)]  # fmt: skip
    for name, by_arm in t["dev"].items():
        label = f"{name} (`{t['candidates'][name]['digest']}`)" if name in t["candidates"] \
            else f"{name} (released Harness)"  # fmt: skip
        cells = [f"{by_arm[a]['errors']} / {by_arm[a]['cases']}" for a in t["arms"]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    beats = "fewer" if t["chosen_beats_original_on_dev"] else "no fewer"
    lines += ["", f"Chosen and frozen: **{t['chosen']}** ({beats} dev errors than the released "
              "Harness).", "",
              "| checkpoint | held-out errors before | after | reduction | change in error rate "
              "(95% interval) | problems before -> after |", "|---|---:|---:|---:|---|---|"]  # fmt: skip
    for arm, title in zip(t["arms"], titles, strict=True):
        h = t["heldout"][arm]
        red = "-" if h["reduction"] is None else f"{100 * h['reduction']:.1f}%"
        ch = h["error_rate_change"]
        change = f"{_signed(ch['delta'])} ({_signed(ch['low'])} – {_signed(ch['high'])})" if ch \
            else "-"  # fmt: skip
        probs = " -> ".join(", ".join(f"{k} {v}" for k, v in h[w]["problems"].items()) or "none"
                            for w in ("before", "after"))  # fmt: skip
        lines.append(f"| {title} | {h['before']['errors']} / {h['before']['cases']} | "
                     f"{h['after']['errors']} / {h['after']['cases']} | {red} | {change} | "
                     f"{probs} |")  # fmt: skip
    return [*lines, ""]


def _plot(root: pathlib.Path, manifest: dict[str, Any], sets: list[str], scores: dict) -> bool:
    from hat_jax.eval import _report as eval_report

    if not scores:
        return False
    runs = [(manifest["arms"][arm]["title"], {s: i.mean for s, i in by_set.items()}, by_set)
            for arm, by_set in scores.items()]  # fmt: skip
    eval_report.bar_plot(root / PLOT, "avg score per set (x100), 95% bootstrap intervals",
                         sets, runs)  # fmt: skip
    return True


def write_report(root: pathlib.Path, manifest: dict[str, Any]) -> pathlib.Path:
    """Writes `<root>/report.md` (and the plot) from the manifest and the arms' evaluations."""
    c = manifest["config"]
    git = manifest.get("git") or {}
    commit = f"`{git['commit'][:12]}`" + (" (uncommitted changes)" if git.get("dirty") else "") \
        if git else "not a git checkout"  # fmt: skip
    sets, scores = _scores(root, manifest)
    lines = [
        "# Miniature reproduction (paper Table 3)",
        "",
        f"- Workdir: `{manifest['workdir']}`; status **{manifest['status']}**"
        + (f" (failed arm: `{manifest['failed_arm']}`)" if manifest.get("failed_arm") else ""),
        f"- Code: {commit}",
        "- Each arm is a pipeline run under `<workdir>/<arm>` (its own `report.md` and "
        "`manifest.json`), started from its parent's policy; every arm is evaluated on the same "
        "set versions (`sets/`), so comparisons pair items.",
        "",
        "## Arms",
        "",
        "| arm | starts from | status | seconds |",
        "|---|---|---|---:|",
    ]
    arms = manifest["arms"]
    for arm, e in arms.items():
        parent = arms[e["parent"]]["title"] if e["parent"] else "random weights"
        seconds = f"{e['seconds']:.0f}" if "seconds" in e else ""
        lines.append(f"| {e['title']} (`{arm}`) | {parent} | {e['status']} | {seconds} |")
    total = sum(e.get("seconds", 0.0) for e in arms.values())
    lines += [f"| all | | | {total:.0f} |", ""]
    lines += [
        "## Scores",
        "",
        f"The `avg` of each set (x100; T1/T2: the mean of Accuracy and Effectiveness per item), "
        f"with 95% percentile bootstrap intervals ({c['resamples']} resamples "
        f"of the items, seed {c['seed']}).",
        "",
        *_table(manifest, sets, scores),
        "",
    ]
    if _plot(root, manifest, sets, scores):
        lines += [f"![scores]({PLOT})", ""]
    if manifest["effects"]:
        lines += ["## The paper's effects", "",
                  "Paired bootstrap of the second arm against the first on the set's items; an "
                  "effect reproduces when the interval excludes zero in the paper's direction "
                  "(a level effect: when it lies within the margin). An effect on the agent's "
                  f"task (T1, T2) is \"task not learned\" when neither arm's Effectiveness "
                  f"reaches {_pct(c['min_effectiveness'])}: both fail the task, so their "
                  "difference says nothing about it.",
                  "", *_effects(manifest), ""]  # fmt: skip
    lines += _names(manifest, sets)
    lines += _edit_test(manifest)
    if manifest["comparisons"]:
        lines += ["## All comparisons", "", *_comparisons(manifest, sets), ""]
    return files.write_text(root / REPORT, "\n".join(lines).rstrip() + "\n")
