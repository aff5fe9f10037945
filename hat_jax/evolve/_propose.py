"""Proposals: edits of the current Harness for the largest failure clusters, as a new version.

A proposer edits a working copy of the current version's folder for each cluster it has an
answer for and says why. `propose` then loads and validates the copy: a copy that fails is
reported with every problem's file and field and is never stored; one that passes becomes a
version (`versions/<hash>/`) with `proposals/<hash>/diff.patch` (a unified diff of the changed
files) and `proposal.json`. Nothing is promoted here (`decide` does that).

`RuleProposer` (offline) answers from the cluster's evidence and the versions promoted before:

- a Hook refusing a tool no loaded Skill allows (`hook require_skill_permission: T`,
  `tool not_allowed: T`): add T to `allowed-tools` of the Reply Skill the failing runs loaded;
- a Skill the policy could not load (`skill unavailable: S`): restore `skills/S/` from the
  newest earlier promoted version that has it;
- another Hook's refusals, or a tool the registry no longer knows: restore `hooks.yaml` /
  `tools.json` from the newest earlier promoted version where it differs.

`LLMProposer` asks an OpenAI-compatible model for whole-file edits of the same folder.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import json
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hat_jax import files
from hat_jax import harness as hx
from hat_jax.evolve import _diagnose
from hat_jax.evolve import _registry as reg

PROPOSALS = "proposals"
_ALLOWED = re.compile(r"^allowed-tools:[ \t]*(.*)$", re.MULTILINE)


class ProposalInvalid(ValueError):
    """A proposal whose Harness does not validate; `.problems` names each file and field."""

    def __init__(self, problems: Sequence[hx.Problem]):
        self.problems = tuple(problems)
        super().__init__("proposal rejected, the edited Harness does not validate:\n  "
                         + "\n  ".join(str(p) for p in self.problems))  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a proposer may read: the evolution folder, the versions promoted before the current
    one (newest first) and the failed records of the diagnosed run."""

    evolve_dir: pathlib.Path
    earlier: tuple[str, ...]
    records: Mapping[tuple[str, str], Mapping[str, Any]]

    def examples(self, cluster: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        keys = ((e["set"], e["item_id"]) for e in cluster["examples"])
        return [self.records[k] for k in keys if k in self.records]

    def earlier_file(self, rel: str, differs_from: pathlib.Path) -> tuple[str, pathlib.Path] | None:
        """The newest earlier promoted version whose `rel` exists and differs from the copy's."""
        mine = differs_from / rel
        for version in self.earlier:
            theirs = reg.version_dir(self.evolve_dir, version) / rel
            if theirs.exists() and (not mine.exists() or _tree_text(theirs) != _tree_text(mine)):
                return version, theirs
        return None


class Proposer(Protocol):
    def edit(
        self, cluster: Mapping[str, Any], work: pathlib.Path, evidence: Evidence
    ) -> str | None:
        """Edits the working copy `work` for `cluster`; returns why (None: no answer)."""


def _tree_text(path: pathlib.Path) -> dict[str, str]:
    paths = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(p.relative_to(path)): p.read_text(encoding="utf-8") for p in paths if p.is_file()}


class RuleProposer:
    """The offline proposer: edit templates keyed by the cluster's cause (module docstring)."""

    def edit(
        self, cluster: Mapping[str, Any], work: pathlib.Path, evidence: Evidence
    ) -> str | None:
        kind, _, subject = cluster["cause"].partition(": ")
        if kind in ("hook require_skill_permission", "tool not_allowed"):
            return self._allow(subject, cluster, work, evidence)
        if kind == "skill unavailable":
            return self._restore(f"skills/{subject}", work, evidence)
        if kind.startswith("hook "):
            return self._restore("hooks.yaml", work, evidence)
        if kind in ("tool unknown_tool", "tool invalid_arguments", "tool no_executor"):
            return self._restore("tools.json", work, evidence)
        return None

    def _allow(self, tool: str, cluster, work: pathlib.Path, evidence: Evidence) -> str | None:
        loaded = collections.Counter()
        for rec in evidence.examples(cluster):
            traj = rec.get("trajectory") or {}
            renames = hx.RenameMap.from_dict(traj.get("renames") or {})
            loaded.update(renames.canonical_skill(s) for s in traj.get("loaded_skills", []))
        try:
            harness = hx.load(work)
        except hx.HarnessError:  # an earlier edit broke the copy: `propose` reports it
            return None
        skills = [harness.skill(name) for name, _ in loaded.most_common()]
        # The Reply Skill answers the question, so it is the one to carry the tool.
        for skill in sorted(filter(None, skills), key=lambda s: s.kind != "reply"):
            name = skill.name
            if tool in skill.allowed_tools:
                continue
            path = work / "skills" / name / "SKILL.md"
            text = path.read_text(encoding="utf-8")
            m = _ALLOWED.search(text)
            if m is None:
                continue
            line = f"allowed-tools: {' '.join([*m.group(1).split(), tool])}"
            path.write_text(text[: m.start()] + line + text[m.end() :], encoding="utf-8")
            return (f"{tool} was refused by require_skill_permission after the runs loaded "
                    f"{name}: allow it in skills/{name}/SKILL.md")  # fmt: skip
        return None

    def _restore(self, rel: str, work: pathlib.Path, evidence: Evidence) -> str | None:
        found = evidence.earlier_file(rel, work)
        if found is None:
            return None
        version, source = found
        target = work / rel
        if target.is_dir():
            shutil.rmtree(target)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)
        return f"restore {rel} as promoted in {version}"


def unified_diff(old: pathlib.Path, new: pathlib.Path) -> str:
    """A unified diff of every text file that differs between two Harness folders."""
    a, b = _tree_text(old), _tree_text(new)
    out = []
    for rel in sorted(set(a) | set(b)):
        if rel == reg.MANIFEST or a.get(rel) == b.get(rel):
            continue
        out += difflib.unified_diff(
            a.get(rel, "").splitlines(keepends=True), b.get(rel, "").splitlines(keepends=True),
            fromfile=f"a/{rel}" if rel in a else "/dev/null",
            tofile=f"b/{rel}" if rel in b else "/dev/null",
        )  # fmt: skip
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def propose(
    evolve_dir: os.PathLike | str,
    failures_dir: os.PathLike | str,
    proposer: Proposer,
    *,
    top: int = 3,
) -> dict[str, Any]:
    """Drafts a new version of the current Harness for the `top` largest clusters.

    Returns:
      `{"version", "parent", "edits": [{"cluster", "cause", "why"}], "skipped": [...],
      "diff"}`; `version` is None when no cluster had an answer (nothing stored).

    Raises:
      ProposalInvalid: the edited Harness does not validate (nothing stored; the rejection is
        recorded in the history with its problems).
    """
    evolve_dir = pathlib.Path(evolve_dir)
    report = json.loads((pathlib.Path(failures_dir) / "failures.json").read_text("utf-8"))
    parent = reg.current(evolve_dir)
    run_dir = report["eval_run_dir"]
    records, _ = _diagnose.read_records(run_dir)
    earlier = tuple(v for v in reversed(reg.promoted(evolve_dir)) if v != parent)
    evidence = Evidence(evolve_dir, earlier, {(r["set"], r["id"]): r for r in records})
    edits, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="proposal.") as tmp:
        work = pathlib.Path(tmp) / "harness"
        shutil.copytree(reg.version_dir(evolve_dir, parent), work)
        (work / reg.MANIFEST).unlink(missing_ok=True)
        for c in report["clusters"][:top]:
            if any(e["cause"] == c["cause"] for e in edits):
                edits.append({"cluster": c["id"], "cause": c["cause"], "why": "same edit"})
                continue
            why = proposer.edit(c, work, evidence)
            target = edits if why else skipped
            target.append({"cluster": c["id"], "cause": c["cause"], "why": why or "no template"})
        return _register(evolve_dir, parent, work, {"failures": str(failures_dir),
                                                    "edits": edits, "skipped": skipped})  # fmt: skip


def submit(evolve_dir: os.PathLike | str, folder: os.PathLike | str, note: str = "") -> dict:
    """An operator's own edit of the current version (a whole folder) as a proposal: validated,
    stored with its diff, not promoted. Same returns and errors as `propose`."""
    evolve_dir = pathlib.Path(evolve_dir)
    return _register(evolve_dir, reg.current(evolve_dir), pathlib.Path(folder),
                     {"edits": [{"cluster": "", "cause": "operator edit", "why": note}],
                      "skipped": []})  # fmt: skip


def _register(evolve_dir: pathlib.Path, parent: str, work: pathlib.Path, about: dict) -> dict:
    """Stores the edited folder `work` as a proposed version of `parent` with its diff."""
    diff = unified_diff(reg.version_dir(evolve_dir, parent), work)
    if not diff:
        return {"version": None, "parent": parent, **about, "diff": ""}
    try:
        version = reg.store(evolve_dir, work)
    except hx.HarnessError as err:
        reg.record(evolve_dir, {"event": "rejected", "parent": parent,
                                "problems": [str(p) for p in err.problems]})  # fmt: skip
        raise ProposalInvalid(err.problems) from None
    folder = evolve_dir / PROPOSALS / version
    files.write_text(folder / "diff.patch", diff)
    result = {"version": version, "parent": parent, **about}
    files.write_json(folder / "proposal.json", result)
    reg.record(evolve_dir, {"event": "proposed", "version": version, "parent": parent,
                            "proposal": str(folder)})  # fmt: skip
    return {**result, "diff": diff}


_LLM_SYSTEM = """You maintain the runtime Harness (Skills, system prompt, Hooks, tool
descriptions) of a live-commerce AI host. The model is fixed; only these files may change. Given a
failure cluster with example runs and the Harness files, propose the smallest edit that fixes the
cluster without changing behaviour elsewhere. Answer with one JSON object and nothing else:
{"why": "<one sentence>", "files": {"<relative path>": "<the whole new file content>"}}
Return {"why": "", "files": {}} when no edit of these files would help."""


class LLMProposer:
    """Whole-file edits drafted by an OpenAI-compatible model (an operator reviews the diff).

    Args:
      base_url: the endpoint (`.../v1`).
      model: the model name.
      api_key_env: the environment variable holding its key (None: no key).
      transport: an `httpx` transport (tests).
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None,
                 transport=None):  # fmt: skip
        import httpx

        self.url, self.model = base_url.rstrip("/") + "/chat/completions", model
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self._client = httpx.Client(timeout=httpx.Timeout(120.0), transport=transport)

    def edit(
        self, cluster: Mapping[str, Any], work: pathlib.Path, evidence: Evidence
    ) -> str | None:
        from hat_jax import llm_client

        runs = []
        for rec in evidence.examples(cluster):
            runs += [f"- {rec['set']} {rec['id']}", *_diagnose.trajectory_lines(rec)]
        harness_files = "\n\n".join(f"=== {rel}\n{text}" for rel, text in _tree_text(work).items())
        user = (f"Cluster {cluster['id']}: category {cluster['category']}, cause "
                f"{cluster['cause']}, {cluster['count']} failures.\n\nExample runs:\n"
                + "\n".join(runs) + f"\n\nHarness files:\n{harness_files}")  # fmt: skip
        payload = {"model": self.model, "temperature": 0.0, "max_tokens": 8192,
                   "messages": [{"role": "system", "content": _LLM_SYSTEM},
                                {"role": "user", "content": user}]}  # fmt: skip
        answer = llm_client.complete(self._client, self.url, payload, api_key=self.api_key)
        try:
            data = json.loads(re.sub(r"^```(?:json)?|```$", "", (answer or "").strip()))
            edits, why = dict(data.get("files") or {}), str(data.get("why") or "")
        except (ValueError, TypeError, AttributeError):
            return None
        root = work.resolve()
        for rel, content in edits.items():
            path = (work / rel).resolve()
            if root not in path.parents or not isinstance(content, str):
                return None
        for rel, content in edits.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(content, encoding="utf-8")
        return (why or f"model {self.model} edited {sorted(edits)}") if edits else None
