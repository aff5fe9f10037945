"""The HAT pipeline as one resumable, manifested run: base -> corpus -> HSA-SFT -> General OPD
-> HSA-RL -> MTP adaptation -> HF export -> evaluation, each stage the launch module a user
runs alone (`launch.<stage>.run`), called in-process.

Only orchestration lives here: `wire` points each stage's input at the previous stage's output
under the workdir (the base, trained on general instructions by `launch.sft` in "general" mode
and scored on the general set, is SFT's initialisation; the SFT checkpoint is OPD's student and
SFT's own initialisation its teacher; the last trained policy is the next stage's start; the
export holds the final policy and the adapted head; evaluation reads the export and compares
itself, item by item, with the base's evaluation). A stage is complete when
`<workdir>/<stage>/COMPLETE.json` exists: written atomically after the stage returned, it holds
the stage's manifest entry. A complete stage is skipped; an interrupted one runs again and
resumes from its own checkpoints (the trainer's, the corpus's finished splits, the evaluation's
finished chunks). `<workdir>/manifest.json` is rewritten atomically around every stage, and
with it `<workdir>/report.md` (`launch._pipeline_report`). A stage
that fails stops the run (`StageFailed` names it); earlier stages' outputs are left alone.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import pathlib
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import ml_collections

from hat_jax import files
from launch import _pipeline_report

STAGES = ("base", "corpus", "sft", "opd", "rl", "mtp", "export", "eval")
TRAINED = ("base", "sft", "opd", "rl")  # stages whose output is the next stage's policy
MARKER = "COMPLETE.json"
MANIFEST = "manifest.json"
_REPO = pathlib.Path(__file__).resolve().parents[1]


class StageFailed(RuntimeError):
    """A stage raised: `stage` names it; the manifest holds the error."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"stage {stage!r} failed: {message}")
        self.stage = stage


def parse_stages(text: str, *, within: tuple[str, ...] = STAGES) -> tuple[str, ...]:
    """Stage names from `"sft,opd"`, in pipeline order; unknown names are refused."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(within))
    if not names or unknown:
        raise ValueError(f"stages {text!r}: unknown {unknown}; choose from {list(within)}")
    return tuple(s for s in STAGES if s in names)


def _policy_before(stage: str, stages: tuple[str, ...], workdir: pathlib.Path) -> str | None:
    """The checkpoints of the last trained stage before `stage` that this run holds."""
    before = [s for s in TRAINED if s in stages and STAGES.index(s) < STAGES.index(stage)]
    return str(workdir / before[-1] / "checkpoints") if before else None


def _copy(block: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy the pipeline may add fields to (a config from the command line is locked)."""
    copy = block.copy_and_resolve_references()
    copy.unlock()
    return copy


def wire(c: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict[str, Any]:
    """Each stage's own config (a copy), its run directory `<workdir>/<stage>` and its input
    the previous stage's output; a stage whose producer is not in `c.stages` keeps its block's
    input."""
    stages = parse_stages(c.stages)
    room = pipeline_room(c)
    out: dict[str, Any] = {}
    base = _copy(c.base)
    base.run_dir = str(workdir / "base")
    base.data.corpus = str(workdir / "base" / "corpus")
    base.data.eval_split = "dev" if base.general.dev else ""
    base.evaluation = _copy(c.eval)  # the base on the sets `base_eval_sets` names
    base.evaluation.update(dict(sets=c.base_eval_sets, run_dir=str(workdir / "base" / "eval"),
                                baseline=""))  # fmt: skip
    base.evaluation.policy.update(
        dict(kind="jax", checkpoint=str(workdir / "base" / "checkpoints"))
    )
    for name in base.evaluation.sizes:  # only its own sets' fields (its config hash ignores others)
        if name not in c.base_eval_sets.split(","):
            base.evaluation.sizes[name], base.evaluation.versions[name] = 0, ""
    out["base"] = base
    corpus = _copy(c.corpus)
    corpus.out = str(workdir / "corpus")
    corpus.room = room
    out["corpus"] = corpus
    for name in ("sft", "opd", "rl", "mtp", "eval"):
        block = _copy(c[name])
        block.run_dir = str(workdir / name)
        out[name] = block
    out["rl"].sim.room = room  # the room's scenarios and released Harness everywhere
    out["eval"].room = base.evaluation.room = room
    if "corpus" in stages:
        out["sft"].data.corpus = corpus.out
        out["sft"].data.eval_split = "dev" if corpus.dev_scenarios else ""
        if out["mtp"].data.source == "corpus":  # the draft head learns the agent's prompts
            out["mtp"].data.corpus = corpus.out  # held out: its eval split (the corpus's dev)
    if "base" in stages:  # SFT starts from the base
        out["sft"].init.update(dict(kind="orbax", path=str(workdir / "base" / "checkpoints")))
    if "sft" in stages:  # the student is the SFT policy; its teacher, the model SFT started from
        out["opd"].policy.update(dict(kind="orbax", path=_policy_before("opd", stages, workdir)))
        sft = out["sft"]
        out["opd"].teacher.update(dict(kind=sft.init.kind, path=sft.init.path,
                                       seed=sft.trainer.seed))  # fmt: skip
    for name in ("rl", "mtp"):
        policy = _policy_before(name, stages, workdir)
        if policy:
            out[name].policy.update(dict(kind="orbax", path=policy))
    out["mtp"].export.hf_dir = ""  # the export stage writes the policy and the head together
    export = _copy(c.export)
    export.checkpoint = _policy_before("mtp", stages, workdir) or out["mtp"].policy.path
    export.mtp = str(workdir / "mtp" / "head") if "mtp" in stages else ""
    export.out = str(workdir / "export" / "hf")
    out["export"] = export
    if "export" in stages:
        out["eval"].policy.update(dict(kind="jax", checkpoint=export.out))
    if "base" in stages and c.base_eval_sets and not out["eval"].baseline:
        out["eval"].baseline = base.evaluation.run_dir  # paired deltas on the sets both ran
    return out


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _config_hash(block: ml_collections.ConfigDict) -> str:
    text = json.dumps(block.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def git_commit() -> dict[str, Any] | None:
    """The repository's commit and whether the tree differs from it (None outside git)."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=_REPO, capture_output=True, text=True,  # noqa: E731
                                        timeout=20, check=True).stdout.strip()  # fmt: skip
        return {"commit": run("rev-parse", "HEAD"), "dirty": bool(run("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return None


def pipeline_room(c: ml_collections.ConfigDict) -> str:
    """The bundled live room every stage of the run uses (`c.room`; "v0" when a config has
    none), checked by name."""
    from hat_jax import livestream

    room = c.get("room", "v0")
    livestream.room(room)  # an unknown room is refused here, naming the known ones
    return room


def harness_version(c: ml_collections.ConfigDict) -> dict[str, str]:
    """The released Harness the run trains and evaluates against: the RL block's world
    folder's own, else the room's."""
    from hat_jax import harness as hx
    from hat_jax import livestream

    room = pipeline_room(c)
    base = hx.load(c.rl.sim.world or livestream.room(room).harness_dir)
    return {"room": room, "name": base.name, "release": base.release, "version": base.version}


def _finished(result: Any, block: ml_collections.ConfigDict) -> None:
    """A trained stage that stopped early (preempted) is not complete."""
    total = block.trainer.total_steps
    if getattr(result, "preempted", False) or result.step < total:
        raise RuntimeError(f"stopped at step {result.step} of {total}; run again to resume")


def _corpus(b: ml_collections.ConfigDict, mesh: Any) -> dict[str, Any]:
    """The teacher corpus's splits; a split whose manifest exists is finished and reused."""
    import data

    out = pathlib.Path(b.out)
    splits = {"train": b.num_scenarios} | ({"dev": b.dev_scenarios} if b.dev_scenarios else {})
    versions = {}
    for split, scenarios in splits.items():
        path = out / f"{split}.manifest.json"
        if not path.is_file():
            config = data.CorpusConfig(
                room=b.room, split=split, num_scenarios=scenarios,
                sample=b.get("sample", "uniform"), states_per_scenario=b.states_per_scenario,
                states=b.states, hsa_dims=b.hsa_dims, hsa_strength=b.hsa_strength, seed=b.seed,
            )  # fmt: skip
            data.write_corpus(config, out, num_shards=b.num_shards)
        m = json.loads(path.read_text())
        versions[split] = {"manifest_sha256": _sha256(path), "room": m.get("room", "v0"),
                           "records": m["records"],
                           "states": m["config"]["states"], "hsa_dims": m["hsa_dims"],
                           "harness": m["harness"]["version"]}  # fmt: skip
    return {"inputs": {}, "outputs": {"corpus": str(out)}, "versions": {"corpus": versions}}


def _base(b: ml_collections.ConfigDict, mesh: Any) -> dict[str, Any]:
    """The general-instruction corpus (kept when complete), the base trained on it (`launch.sft`
    in "general" mode, resumed from its checkpoints), then its evaluation on `evaluation.sets`."""
    import data

    g = b.general
    manifests = data.write_general_corpus(b.data.corpus, train=g.train, dev=g.dev, seed=g.seed,
                                          lookup_share=g.get("lookup_share", 0.0))  # fmt: skip
    entry = RUNNERS["sft"](b, mesh)
    entry["inputs"] = {"corpus": b.data.corpus, "init": _source(b.init)}
    sizes = ", ".join(f"{split} {m['records']}" for split, m in manifests.items())
    floor = manifests["train"]["floor"]["prompt_strict"]
    entry["result"]["summary"].insert(0, f"general corpus: {sizes} records (answers checked "
                                      "against every constraint; on-topic answers that ignore "
                                      f"the instructions score prompt-strict {floor:.3f})")  # fmt: skip
    corpus = pathlib.Path(b.data.corpus)
    entry["versions"] = {"general_corpus": {
        split: {"manifest_sha256": _sha256(corpus / f"{split}.manifest.json"),
                "records": m["records"]} for split, m in manifests.items()}}  # fmt: skip
    if b.evaluation.sets:
        evaluated = _eval(b.evaluation, mesh)
        entry["outputs"]["eval"] = evaluated["outputs"]["report"]
        entry["versions"].update(evaluated["versions"])
        entry["result"]["summary"] += evaluated["result"]["summary"]
    return entry


def _source(part: ml_collections.ConfigDict) -> str:
    return f"{part.kind}:{part.path}"


def _trained(name: str, inputs: Callable, outputs: Callable) -> Callable:
    """A training stage's runner: `launch.<name>.run` in-process, then its record."""

    def run(b: ml_collections.ConfigDict, mesh: Any) -> dict[str, Any]:
        stage = importlib.import_module(f"launch.{name}")
        result = stage.run(b, run_dir=b.run_dir, mesh=mesh)
        _finished(result, b)
        return {"inputs": inputs(b), "outputs": outputs(result),
                "result": {"step": result.step, "resumed_from": result.resumed_from,
                           "summary": stage.summary(result)}}  # fmt: skip

    return run


def _export(b: ml_collections.ConfigDict, mesh: Any) -> dict[str, Any]:
    """The final policy (and the adapted head) as a Hugging Face directory, written anew."""
    from serve import convert

    out = pathlib.Path(b.out)
    if out.exists():  # an interrupted export: its files are not trusted
        shutil.rmtree(out)
    tokenizer_dir = b.tokenizer_dir or str(_REPO / "data" / "tokenizer")
    convert.to_hf(b.checkpoint, out, mtp=b.mtp or None, tokenizer_dir=tokenizer_dir,
                  dtype=b.dtype)  # fmt: skip
    if b.mtp and not convert.has_mtp(out):
        raise RuntimeError(f"{out}: the export holds no mtp.* draft head")
    summary = [f"Hugging Face directory {out}" + (" with the mtp.* draft head" if b.mtp else "")]
    if b.get("check_transformers", False):
        diff = convert.compare_with_transformers(out)
        if not diff <= b.max_logit_diff:
            raise RuntimeError(f"{out}: transformers' logits differ from ours by {diff:.3g} "
                               f"(> max_logit_diff {b.max_logit_diff:g})")  # fmt: skip
        summary.append(f"reloaded with transformers: max |logits diff| vs ours {diff:.2e}")
    return {"inputs": {"checkpoint": b.checkpoint, "mtp": b.mtp},
            "outputs": {"hf_dir": str(out)}, "result": {"summary": summary}}  # fmt: skip


def _eval(b: ml_collections.ConfigDict, mesh: Any) -> dict[str, Any]:
    from launch import eval as eval_launch

    summary = eval_launch.run(b, run_dir=b.run_dir)
    run_dir = pathlib.Path(b.run_dir)
    return {
        "inputs": {"policy": f"{b.policy.kind}:{b.policy.checkpoint}", "sets_dir": b.sets_dir},
        "outputs": {"summary": str(run_dir / "summary.json"), "report": str(run_dir / "report.md")},
        "versions": {"eval_sets": {k: s["version"] for k, s in summary["sets"].items()}},
        "result": {"summary": eval_launch.summary_lines(summary)},
    }  # fmt: skip


# Each stage: (wired block, mesh) -> {"inputs", "outputs", and optionally "versions", "result"}.
RUNNERS: dict[str, Callable[[ml_collections.ConfigDict, Any], dict[str, Any]]] = {
    "base": _base,
    "corpus": _corpus,
    "sft": _trained(
        "sft",
        lambda b: {"corpus": b.data.corpus, "init": _source(b.init)},
        lambda r: {"checkpoint": str(r.checkpoint_dir), "metrics": str(r.metrics_path)},
    ),
    "opd": _trained(
        "opd",
        lambda b: {
            "policy": _source(b.policy),
            "teacher": f"{_source(b.teacher)} (seed {b.teacher.seed})",
        },
        lambda r: {"checkpoint": str(r.checkpoint_dir), "summary": str(r.summary_path)},
    ),
    "rl": _trained(
        "rl",
        lambda b: {
            "policy": _source(b.policy),
            "hsa_dims": b.sim.hsa_dims,
            "original_fraction": b.sim.original_fraction,
        },
        lambda r: {"checkpoint": str(r.checkpoint_dir), "summary": str(r.summary_path)},
    ),
    "mtp": _trained(
        "mtp",
        lambda b: {"policy": _source(b.policy), "head": _source(b.head)},
        lambda r: {"head": str(r.head_dir), "summary": str(r.summary_path)},
    ),
    "export": _export,
    "eval": _eval,
}


def marker(workdir: pathlib.Path, stage: str) -> pathlib.Path:
    return workdir / stage / MARKER


def _read(path: pathlib.Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _plan(root, stages, selected, done: dict[str, dict], wired) -> list[str]:
    """The stages to run now; refuses a run that would mix outputs of different inputs."""
    for name, entry in done.items():
        if entry["config_hash"] != _config_hash(wired[name]):
            raise StageFailed(name, "it completed with another config: use another workdir, "
                              f"--fresh, or remove {root / name}")  # fmt: skip
    todo = [s for s in selected if s not in done]
    for name in todo:
        missing = [s for s in stages[: stages.index(name)] if s not in done and s not in todo]
        if missing:
            raise StageFailed(name, f"its input comes from {missing}, which are not complete")
    if todo:
        stale = [s for s in stages[stages.index(todo[0]) + 1 :] if s in done]
        if stale:
            raise StageFailed(todo[0], f"it runs again, but the complete later stages {stale} "
                              "were made from its old output: remove them or use --fresh")  # fmt: skip
    return todo


def _write(workdir: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Atomically, with the versions every stage recorded gathered at the top."""
    for entry in manifest["entries"].values():
        manifest["versions"].update(entry.get("versions", {}))
    manifest["updated"] = _now()
    files.write_json(workdir / MANIFEST, manifest, default=str)
    _pipeline_report.write_report(workdir, manifest)


def run_pipeline(
    c: ml_collections.ConfigDict,
    *,
    workdir: str | None = None,
    only: str | None = None,
    fresh: bool = False,
    mesh: Any = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs the stages of `c.stages` (or the subset `only`) that are not complete, in order,
    and returns the manifest (also `<workdir>/manifest.json`).

    Raises:
      StageFailed: a stage raised (after the manifest recorded it), or the plan would mix
        outputs (a complete stage made with another config, or downstream of one that runs
        again; an input stage that is neither complete nor selected).
    """
    root = pathlib.Path(workdir or c.workdir)
    if fresh and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    stages = parse_stages(c.stages)
    selected = parse_stages(only, within=stages) if only else stages
    wired = wire(c, root)
    done = {s: e for s in stages if (e := _read(marker(root, s))) is not None}
    _plan(root, stages, selected, done, wired)
    previous = _read(root / MANIFEST) or {}
    for earlier in previous.get("invocations", []):  # its process died without closing it
        if earlier.get("status") == "running":
            earlier["status"] = "interrupted"
    invocation = {"started": _now(), "selected": list(selected), "skipped": [s for s in selected
                  if s in done], "ran": [], "status": "running"}  # fmt: skip
    manifest = {
        "format": 1,
        "workdir": str(root),
        "stages": list(stages),
        "room": pipeline_room(c),
        "config": c.to_dict(),
        "versions": {"harness": harness_version(c), "git": git_commit()},
        "invocations": [*previous.get("invocations", []), invocation],
        "status": "running",
        "entries": {s: done.get(s) or {"status": "pending", "config": wired[s].to_dict()}
                    for s in stages},
    }  # fmt: skip
    _write(root, manifest)
    for name in selected:
        if name in done:
            log(f"[pipeline] {name}: complete, skipped ({marker(root, name)})")
            continue
        log(f"[pipeline] {name}: running ...")
        entry = {"status": "running", "config": wired[name].to_dict(),
                 "config_hash": _config_hash(wired[name]), "started": _now()}  # fmt: skip
        manifest["entries"][name] = entry
        invocation["ran"].append(name)
        _write(root, manifest)
        start = time.perf_counter()
        try:
            entry |= RUNNERS[name](wired[name], mesh)
        except Exception as e:
            entry.update(status="failed", ended=_now(), error=f"{type(e).__name__}: {e}",
                         seconds=round(time.perf_counter() - start, 1))  # fmt: skip
            manifest.update(status="failed", failed_stage=name)
            invocation["status"] = "failed"
            _write(root, manifest)
            raise StageFailed(name, entry["error"]) from e
        entry.update(status="complete", ended=_now(), seconds=round(time.perf_counter() - start, 1))
        files.write_json(marker(root, name), entry, default=str)
        _write(root, manifest)
        log(f"[pipeline] {name}: complete in {entry['seconds']} s")
    complete = all(manifest["entries"][s]["status"] == "complete" for s in stages)
    invocation["status"] = "complete"
    manifest["status"] = "complete" if complete else "partial"
    manifest.pop("failed_stage", None)
    _write(root, manifest)
    return manifest
