"""README against what the demo writes: every heading or label README quotes (in double
quotes) where it points at `runs/demo/report.md` is one the report writers still produce,
checked by running them on a small hand-made pipeline workdir; and a figure README gives
beside `make demo` carries the date it was measured, since one run of the demo gives other
figures than the next and the report, not README, holds the current ones."""

import json
import pathlib
import re

import pytest

from hat_jax.eval._report import write_report as write_eval_report
from launch._pipeline_report import write_report

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
REPORT = "runs/demo/report.md"
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_FIGURE = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")  # 2.3, 25.0; not 0.5.23 or 3.11.x


def blocks(text: str) -> list[str]:
    """README's table rows, headings, bullets (with their continuation lines) and paragraphs,
    each as one string; fenced code is left out."""
    out: list[str] = []
    current: list[str] = []
    fenced = False

    def flush():
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip():
            flush()
        elif line.startswith(("|", "#")):
            flush()
            out.append(line)
        elif line.startswith("- "):
            flush()
            current.append(line)
        else:
            current.append(line.strip())
    flush()
    return out


def promised_labels(text: str) -> list[str]:
    """The double-quoted names in README's blocks that point at the demo's report."""
    return [q for b in blocks(text) if REPORT in b for q in re.findall(r'"([^"\n]+)"', b)]


def _items(set_name: str, rows: list[tuple[str, str, dict[str, float]]]) -> str:
    trajectory = {
        "request": {"comments": [{"text": "how much is the serum?"}]},
        "model_calls": [{"round": 1, "output": {
            "reasoning": "Load product-qa; call search_products.",
            "tool_calls": [{"function": {"name": "load_skill",
                                         "arguments": {"name": "product-qa"}}}]}}],
    }  # fmt: skip
    return "".join(
        json.dumps({"id": i, "set": set_name, "family": f, "scores": s, "output": "It is 199.",
                    "trajectory": trajectory, "seconds": 0.1}) + "\n"
        for i, f, s in rows
    )  # fmt: skip


def _eval_run(path: pathlib.Path, sets: dict[str, list]) -> pathlib.Path:
    summary = {"run": {"policy": {"kind": "jax"}, "room": "v0", "harness": "v0"}, "sets": {}}
    (path / "items").mkdir(parents=True)
    for name, rows in sets.items():
        metrics = list(rows[0][2])
        mean = {m: sum(s[m] for _, _, s in rows) / len(rows) for m in metrics}
        families = {f: {"n": 1, **s} for _, f, s in rows}
        summary["sets"][name] = {"version": f"{name}-v", "n": len(rows), "metrics": mean,
                                 "families": families}  # fmt: skip
        (path / "items" / f"{name}.jsonl").write_text(_items(name, rows))
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def _qa(effectiveness: list[float]) -> list:
    return [
        (f"t1-{k}", fam, {"accuracy": 1.0, "effectiveness": e, "avg": (1.0 + e) / 2,
                          "skill_selection": 1.0, "tool_rationality": 0.5})
        for k, (fam, e) in enumerate(zip(["price", "after_sales", "chit_chat"], effectiveness))
    ]  # fmt: skip


def _general(scores: list[float]) -> list:
    return [(f"g-{k}", "general", {"prompt_strict": s, "instruction_strict": s})
            for k, s in enumerate(scores)]  # fmt: skip


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> str:
    """`report.md` of a hand-made pipeline workdir with every stage complete: the stages' own
    files (the evaluation's and the base's runs, SFT's metrics, RL's summary) as they write
    them, the evaluation's report written by its writer against the base."""
    root = tmp_path_factory.mktemp("demo")
    base = _eval_run(root / "base" / "eval", {"general": _general([1.0, 0.0, 0.0, 1.0])})
    run = _eval_run(root / "eval", {"t1": _qa([1.0, 0.5, 0.0]), "t2": _qa([0.0, 0.0, 1.0]),
                                    "general": _general([1.0, 1.0, 0.0, 0.0])})  # fmt: skip
    write_eval_report(run, baseline_dir=base, resamples=100)
    (root / "sft").mkdir()
    (root / "sft" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "eval/loss": 2.0 / s, "eval/skill_decision": 0.25,
                    "eval/tool_choice": 0.5, "eval/tool_decision": 0.125}) + "\n"
        for s in (26, 52)))  # fmt: skip
    (root / "rl").mkdir()
    change = {"n": 4, "before": 0.5, "after": 0.625, "delta": 0.125, "low": 0.0, "high": 0.25}
    (root / "rl" / "rl_summary.json").write_text(json.dumps({"change": {"mean": change}}))
    stages = ["base", "corpus", "sft", "opd", "rl", "mtp", "export", "eval"]
    entries = {s: {"status": "complete", "seconds": 1.0, "ended": "2026-12-06T00:00:00",
                   "result": {"summary": [f"{s} figures"]}} for s in stages}  # fmt: skip
    entries["mtp"]["result"]["summary"] = ["acceptance 0.20 -> 0.35 (simulated length 1.4)"]
    entries["eval"]["outputs"] = {"summary": str(run / "summary.json"),
                                  "report": str(run / "report.md")}  # fmt: skip
    manifest = {
        "workdir": str(root),
        "status": "complete",
        "versions": {"git": None,
                     "harness": {"room": "v0", "name": "harness", "release": "v0",
                                 "version": "h-0"}},
        "invocations": [{"started": "2026-12-06T00:00:00", "ran": stages, "skipped": []}],
        "stages": stages,
        "entries": entries,
    }  # fmt: skip
    return write_report(root, manifest).read_text()


def test_blocks_and_labels():
    text = (f'Intro.\n\n| a | `make demo` |\n\n- one\n  "x" in `{REPORT}`\n- two "y"\n\n'
            '```bash\n"z" runs/demo/report.md\n```\nlast "w"\n')  # fmt: skip
    assert blocks(text) == ["Intro.", "| a | `make demo` |", f'- one "x" in `{REPORT}`',
                            '- two "y"', 'last "w"']  # fmt: skip
    assert promised_labels(text) == ["x"]


def test_readme_quotes_only_what_the_demo_report_writes(demo_report):
    labels = promised_labels(README.read_text())
    assert "What the final policy does" in labels, "README no longer points at the report"
    missing = [label for label in labels if label not in demo_report]
    assert not missing, f"README quotes {missing} from {REPORT}, which the report no longer has"


def test_readme_figures_beside_make_demo_are_dated():
    undated = [
        b[:120] for b in blocks(README.read_text())
        if "make demo" in b and _FIGURE.search(b) and not _DATE.search(b)
    ]  # fmt: skip
    assert not undated, f"README gives figures of `make demo` without their date: {undated}"
