"""The judge as an evolution case (paper appendix D): the same loop on the judge's own editable
prompts (`judge_system.md`, `judge_user.md`), measured against human labels.

A judge evolution folder (`init(..., kind="judge")`) stores prompt folders as versions.
`judge_diagnose` judges an evaluation run's labelled items with the current prompts and writes
the failure report of the Harness loop (same `failures.json` contract): a failure is a
disagreement with the human label; its category is the dimension and its cause the direction
and the judge's reason. `propose` then works unchanged (`JudgeRuleProposer` offline, or the
`LLMProposer`); `judge_evaluate` measures agreement per dimension before/after (a dimension whose
agreement falls is a regression) and records it so `decide` can promote on it.

`ScriptedJudge` is an offline stand-in for an LLM judge (an `httpx` transport handler): it
applies its system prompt's rubric literally: Effectiveness from the reference facts found in
the reply, with the honest follow-up after a failed tool counted as answered only when the
prompt says so; Accuracy 0 when the reply makes a claim the reference forbids.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import eval as hev
from hat_jax import files
from hat_jax import harness as hx
from hat_jax.evolve import _diagnose
from hat_jax.evolve import _registry as reg

PROMPT_FILES = ("judge_system.md", "judge_user.md")
DIMENSIONS = ("accuracy", "effectiveness")
_FOLLOW_UP = re.compile(r"tool failed.{0,120}follow up", re.IGNORECASE | re.DOTALL)


def judge_version(folder: os.PathLike | str) -> str:
    """Validates a judge prompt folder and returns its version (content hash).

    Raises:
      hx.HarnessError: a missing file, a template that does not parse, or a system prompt that
        no longer asks for both labels (file and field named).
    """
    import jinja2

    folder, problems, texts = pathlib.Path(folder), [], {}
    for name in PROMPT_FILES:
        if not (folder / name).is_file():
            problems.append(hx.Problem(name, "<file>", "missing"))
            continue
        texts[name] = (folder / name).read_text(encoding="utf-8")
    if "judge_user.md" in texts:
        try:
            jinja2.Environment().parse(texts["judge_user.md"])
        except jinja2.TemplateSyntaxError as err:
            problems.append(hx.Problem("judge_user.md", f"line {err.lineno}", err.message))
    for dim in DIMENSIONS:
        if "judge_system.md" in texts and f'"{dim}"' not in texts["judge_system.md"]:
            problems.append(hx.Problem("judge_system.md", "answer format", f'asks no "{dim}"'))
    if problems:
        raise hx.HarnessError(problems)
    return hx.content_hash(texts)[:16]


class ScriptedJudge:
    """An offline judge following its system prompt (module docstring); `httpx.MockTransport(
    ScriptedJudge())` as a `JudgePanel` transport."""

    def __call__(self, request):
        import httpx

        messages = json.loads(request.content)["messages"]
        vote = self.grade(messages[0]["content"], messages[1]["content"])
        message = {"role": "assistant", "content": json.dumps(vote)}
        return httpx.Response(200, json={"choices": [{"message": message}]})

    @staticmethod
    def grade(system: str, user: str) -> dict[str, Any]:
        parts = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", user, re.MULTILINE | re.DOTALL))
        reply = " ".join(parts.get(k, "") for k in ("Reply spoken to the room",
                                                    "Private message to the viewer")).lower()  # fmt: skip
        reference = parts.get("Reference for the evaluator", "")
        facts_text, _, claims_text = reference.partition("Claims the reply must not make:")
        facts = re.findall(r"^- [^:\n]+: (.+?) \(\w+\)$", facts_text, re.MULTILINE)
        claims = [c for c in re.findall(r"^- (.+)$", claims_text, re.MULTILINE) if "(" not in c]
        found = sum(_states(f, reply) for f in facts)
        eff, reason = (1.0, "every question answered") if found == len(facts) else (
            (0.5, "some facts missing") if found else (0.0, "the question is not answered"))  # fmt: skip
        failed = '"error"' in parts.get("Tool calls and results", "")
        if eff < 1 and failed and "follow up" in reply and _FOLLOW_UP.search(system):
            eff, reason = 1.0, "a tool failed and the reply honestly follows up"
        acc = 0.0 if any(c.lower() in reply for c in claims) else 1.0
        return {"accuracy": acc, "effectiveness": eff, "reason": reason}


def _states(fact: str, reply: str) -> bool:
    """Whether the reply states a reference fact (the reference writes alternatives as a
    regular expression: `in stock|available`)."""
    try:
        return re.search(fact, reply, re.IGNORECASE) is not None
    except re.error:
        return fact.lower() in reply


def judge_labels(
    prompt_dir: os.PathLike | str,
    run_dir: os.PathLike | str,
    set_name: str,
    item_ids: Sequence[str],
    judges: Sequence[Any],
    transport=None,
) -> dict[str, tuple[dict[str, float], str]]:
    """The panel's labels and reason for each of `item_ids` of an evaluation run's set."""
    from rl import sim
    from rl.rewards import JudgePanel

    summary = hev.read_summary(run_dir)
    items = {i.id: i for i in hev.read_set(pathlib.Path(summary["run"]["sets_dir"]) / set_name)}
    records = {r["id"]: r for r in hev.read_items(run_dir, set_name)}
    panel = JudgePanel(judges, prompt_dir=prompt_dir, transport=transport)
    out = {}
    try:
        for item_id in item_ids:
            if item_id not in records or not records[item_id].get("trajectory"):
                continue
            scenario = sim.Scenario.from_dict(items[item_id].scenario)
            traj = hx.Trajectory.from_dict(records[item_id]["trajectory"])
            verdict = panel.judge(scenario, traj)
            reason = next((v.reason for v in verdict.votes if v.reason), "")
            labels = {"accuracy": verdict.accuracy, "effectiveness": verdict.effectiveness}
            out[item_id] = ({k: v for k, v in labels.items() if v is not None}, reason)
    finally:
        panel.close()
    return out


def agreement(human, judged) -> dict[str, Any]:
    """`hat_jax.eval.calibration_report` of the panel's labels, and the disagreements."""
    predicted = {(i, d): v for i, (labels, _) in judged.items() for d, v in labels.items()}
    report = hev.calibration_report(human, {"panel": predicted})
    wrong = [{"item_id": i, "dimension": d, "human": h, "judge": predicted[(i, d)],
              "reason": judged[i][1]}
             for (i, d), h in sorted(human.items())
             if (i, d) in predicted and predicted[(i, d)] != h]  # fmt: skip
    return {"agreement": {d: report[d]["panel"]["agreement"] for d in DIMENSIONS},
            "report": report, "disagreements": wrong}  # fmt: skip


def judge_diagnose(evolve_dir, run_dir, set_name, labels_path, out_dir, judges, transport=None):
    """Judges the labelled items with the current prompts; writes `failures.{json,md}` (one
    cluster per dimension and cause) and `agreement.json`."""
    human = hev.read_labels(labels_path)
    version = reg.current(evolve_dir)
    judged = judge_labels(reg.version_dir(evolve_dir, version), run_dir, set_name,
                          sorted({i for i, _ in human}), judges, transport)  # fmt: skip
    result = agreement(human, judged)
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for w in result["disagreements"]:
        why = f"judge {w['judge']:g} where humans say {w['human']:g}: {w['reason']}"
        groups.setdefault((w["dimension"], why), []).append(w)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    clusters = [{"id": f"c{k}", "category": dim, "cause": why, "count": len(rows),
                 "share": round(len(rows) / max(len(human), 1), 4),
                 "examples": [{"run_dir": str(run_dir), "set": set_name, "item_id": w["item_id"]}
                              for w in rows[: _diagnose.EXAMPLES]]}
                for k, ((dim, why), rows) in enumerate(ordered, 1)]  # fmt: skip
    report = {"format": _diagnose.FORMAT, "harness_version": version,
              "eval_run_dir": str(run_dir), "clusters": clusters, "stopping_rule": None}  # fmt: skip
    records, _ = _diagnose.read_records(run_dir)
    files.write_json(pathlib.Path(out_dir) / "failures.json", report)
    files.write_text(pathlib.Path(out_dir) / "failures.md", _diagnose.render(report, records, []))
    files.write_json(pathlib.Path(out_dir) / "agreement.json", result)
    return {**report, "agreement": result["agreement"]}


class JudgeRuleProposer:
    """Offline: a dimension the judge disagrees on whose rubric paragraph lost sentences since
    an earlier promoted prompt gets that paragraph back."""

    def edit(self, cluster, work: pathlib.Path, evidence) -> str | None:
        dim = cluster["category"].capitalize()
        mine = (work / "judge_system.md").read_text(encoding="utf-8")
        for version in evidence.earlier:
            theirs = (reg.version_dir(evidence.evolve_dir, version) / "judge_system.md").read_text(
                encoding="utf-8"
            )
            old, new = _paragraph(theirs, dim), _paragraph(mine, dim)
            if old and new and old != new and _sentences(old) - _sentences(new):
                (work / "judge_system.md").write_text(mine.replace(new, old), encoding="utf-8")
                return f"restore the {dim} rubric of judge prompt {version}"
        return None


def _paragraph(text: str, heading: str) -> str | None:
    return next((p for p in text.split("\n\n") if p.startswith(heading)), None)


def _sentences(text: str) -> set[str]:
    return {s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()}


def judge_evaluate(evolve_dir, candidate, run_dir, set_name, labels_path, judges, transport=None):
    """Agreement per dimension of `candidate` and the current prompts against the human labels;
    writes `evaluations/<cand>-vs-<base>/evaluation.{json,md}` and records the evaluation."""
    human = hev.read_labels(labels_path)
    baseline, ids = reg.current(evolve_dir), sorted({i for i, _ in human})
    result = {}
    for name, version in (("before", baseline), ("after", candidate)):
        judged = judge_labels(reg.version_dir(evolve_dir, version), run_dir, set_name, ids,
                              judges, transport)  # fmt: skip
        result[name] = agreement(human, judged)["agreement"]
    regressions = [d for d in DIMENSIONS if (result["after"][d] or 0) < (result["before"][d] or 0)]
    out = pathlib.Path(evolve_dir) / "evaluations" / f"{candidate}-vs-{baseline}"
    data = {"candidate": candidate, "baseline": baseline, "labels": str(labels_path),
            "agreement": result, "regressions": regressions}  # fmt: skip
    files.write_json(out / "evaluation.json", data)
    rows = [f"| {d} | {result['before'][d]:.3f} | {result['after'][d]:.3f} |"
            f"{' REGRESSED' if d in regressions else ''} |" for d in DIMENSIONS]  # fmt: skip
    files.write_text(out / "evaluation.md", "\n".join([
        f"# Judge prompts {candidate} against the current {baseline}", "",
        f"Agreement with {len(human)} human labels ({labels_path}).", "",
        "| dimension | current | candidate | flag |", "|---|---|---|---|", *rows, ""]))  # fmt: skip
    reg.record(evolve_dir, {"event": "evaluated", "candidate": candidate, "baseline": baseline,
                            "regressions": regressions, "evidence": str(out)})  # fmt: skip
    return {**data, "dir": str(out)}
