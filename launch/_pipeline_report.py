"""`<workdir>/report.md` of a pipeline run, rewritten (atomically) whenever the manifest is:
what ran, with which code, Harness and data, how long each stage took, its figures and curves,
and the evaluation's tables (its own `report.md`, embedded with links made relative to the
workdir)."""

from __future__ import annotations

import pathlib
import platform
import re
from typing import Any

from hat_jax import files
from launch._pipeline_outcome import outcome_lines

REPORT = "report.md"
_TITLES = {
    "base": "Base (general instructions)",
    "corpus": "Teacher corpus",
    "sft": "HSA-SFT",
    "opd": "General OPD",
    "rl": "HSA-RL",
    "mtp": "MTP draft-head adaptation",
    "export": "Hugging Face export",
    "eval": "Evaluation",
}


def _environment() -> str:
    import jax

    return (f"python {platform.python_version()}, jax {jax.__version__}, backend "
            f"{jax.default_backend()} ({jax.device_count()} device(s))")  # fmt: skip


def _header(m: dict[str, Any]) -> list[str]:
    v = m["versions"]
    git = v.get("git") or {}
    commit = f"`{git['commit'][:12]}`" + (" (uncommitted changes)" if git.get("dirty") else "") \
        if git else "not a git checkout"  # fmt: skip
    h = v["harness"]
    last = m["invocations"][-1]
    return [
        "# HAT pipeline report",
        "",
        f"- Workdir: `{m['workdir']}`; status **{m['status']}**"
        + (f" (failed stage: `{m['failed_stage']}`)" if m.get("failed_stage") else ""),
        f"- Code: {commit}; {_environment()}",
        f"- Live room: {h.get('room', 'v0')}; Harness: {h['name']} {h['release']} "
        f"(`{h['version']}`)",
        f"- Last invocation {last['started']}: ran {last['ran'] or 'nothing'}, skipped "
        f"{last['skipped'] or 'nothing'}; the manifest (`manifest.json`) holds every stage's "
        "config, inputs, outputs and versions.",
        "",
    ]


def _table(m: dict[str, Any]) -> list[str]:
    rows = ["| stage | status | seconds | finished |", "|---|---|---:|---|"]
    for name in m["stages"]:
        e = m["entries"][name]
        seconds = f"{e['seconds']:.1f}" if "seconds" in e else ""
        rows.append(f"| {name} | {e['status']} | {seconds} | {e.get('ended', '')} |")
    total = sum(m["entries"][s].get("seconds", 0.0) for s in m["stages"])
    return [*rows, f"| all | | {total:.1f} | |", ""]


def _corpus_lines(e: dict[str, Any]) -> list[str]:
    lines = []
    for split, v in (e.get("versions", {}).get("corpus") or {}).items():
        line = f"{split}: {v.get('records')} teacher episodes kept"
        if "states" in v:
            line += f", Harness states {v['states']}, HSA dimensions {v.get('hsa_dims')}"
        lines.append(f"{line} (stats: `{split}.stats.md` in the corpus folder)")
    return lines


def _embedded_eval(root: pathlib.Path, e: dict[str, Any]) -> list[str]:
    """The evaluation's report without its title, headings one level down, links re-rooted."""
    path = pathlib.Path(e.get("outputs", {}).get("report", ""))
    if not path.is_file():
        return []
    rel = path.parent.relative_to(root) if path.parent.is_relative_to(root) else path.parent
    out = []
    for line in path.read_text().splitlines()[1:]:
        if line.startswith("#"):
            line = "#" + line
        line = re.sub(r"\]\((?!/|https?:)([^)]+)\)", lambda g: f"]({rel}/{g.group(1)})", line)
        out.append(line)
    return out


def _stage(root: pathlib.Path, name: str, e: dict[str, Any]) -> list[str]:
    head = f"## {_TITLES.get(name, name)} (`{name}`)"
    if e["status"] != "complete":
        detail = f": {e['error']}" if e.get("error") else ""
        return [head, "", f"{e['status']}{detail}", ""]
    embedded = _embedded_eval(root, e) if name == "eval" else []
    if name == "corpus":
        lines = _corpus_lines(e)
    elif embedded:  # the tables say it all
        lines = []
    else:
        lines = list(e.get("result", {}).get("summary", []))
    out = [head, "", *[f"- {line}" for line in lines], ""] if lines else [head, ""]
    overview = root / name / "plots" / "overview.png"
    if overview.is_file():
        out += [f"![{name} curves]({name}/plots/overview.png)", ""]
    return out + embedded


def write_report(root: pathlib.Path, manifest: dict[str, Any]) -> pathlib.Path:
    """Writes `<root>/report.md` from `manifest` (and the stages' own files) and returns it."""
    text = _header(manifest) + outcome_lines(root, manifest) + _table(manifest)
    for name in manifest["stages"]:
        text += _stage(root, name, manifest["entries"][name])
    path = root / REPORT
    files.write_text(path, "\n".join(text).rstrip() + "\n")
    return path
