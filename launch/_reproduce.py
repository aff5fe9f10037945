"""The miniature reproduction of the paper's Table 3: every arm trained once, with shared
stages shared, each arm's policy scored on the same set versions, and the paper's effects
checked with paired bootstrap intervals.

An arm is a node of a tree whose root is the base: each node is one `launch.pipeline` run under
`<workdir>/<arm>` that holds only the node's own stages, its input the parent's policy (the SFT
arms start from the base, the OPD arms from their SFT arm, the RL arms from their SFT + OPD arm)
and its last stage the evaluation of its own policy. So a stage two arms share runs once (the
base, each SFT arm), every node is resumable and skipped when complete (the pipeline's
`COMPLETE.json` markers), and every node keeps its pipeline manifest and report. All nodes
evaluate into one `sets_dir`, so their runs pair item by item.

After the arms, the held-out Harness-edit test (`launch._edit_test`) runs on the checkpoints
`edit_test.arms` names. `<workdir>/reproduce.json` (the nodes, their status and timings, the
comparisons, the edit test) and `<workdir>/report.md` (`launch._reproduce_report`) are
rewritten atomically after every node.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from configs import ablations
from hat_jax import files
from launch import _pipeline

MANIFEST = "reproduce.json"
_SFT_STAGES = "corpus,sft,eval"
# What `effect_verdict` can say of one of the paper's effects.
VERDICTS = ("reproduces", "opposite", "not shown", "task not learned", "not run")


@dataclasses.dataclass(frozen=True)
class Node:
    """One arm: the pipeline stages it runs after its parent's policy, and its differences."""

    title: str
    parent: str | None
    stages: str
    fixed_sft: bool = False  # Fixed-Harness SFT (the corpus of the original Harness only)
    agentic_rl: bool = False  # Agentic RL (the original Harness in every episode)


NODES: dict[str, Node] = {
    "base": Node("Base", None, "base"),
    "fixed_sft": Node("Fixed-SFT", "base", _SFT_STAGES, fixed_sft=True),
    "hsa_sft": Node("HSA-SFT", "base", _SFT_STAGES),
    "fixed_sft_opd": Node("Fixed-SFT + OPD", "fixed_sft", "opd,eval"),
    "hsa_sft_opd": Node("HSA-SFT + OPD", "hsa_sft", "opd,eval"),
    "fixed_sft_opd_agentic_rl": Node(
        "Fixed-SFT + OPD + Agentic RL", "fixed_sft_opd", "rl,eval", agentic_rl=True
    ),  # fmt: skip
    "fixed_sft_opd_hsa_rl": Node("Fixed-SFT + OPD + HSA-RL", "fixed_sft_opd", "rl,eval"),
    "hsa_sft_opd_agentic_rl": Node(
        "HSA-SFT + OPD + Agentic RL", "hsa_sft_opd", "rl,eval", agentic_rl=True
    ),  # fmt: skip
    "hsa_sft_opd_hsa_rl": Node("HSA-SFT + OPD + HSA-RL", "hsa_sft_opd", "rl,eval"),
}


@dataclasses.dataclass(frozen=True)
class Effect:
    """A direction the paper reports, as a paired comparison of arm `b` against arm `a`.

    `direction` is "+" (b above a), "-" (b below a) or "=" (level: the interval within
    +-`level_margin`). With `recovers` (an arm), the effect also asks that b win back at least
    half of what a lost against `recovers`: (b - a) / (recovers - a) >= 0.5. An effect
    on the agent's task (T1, T2) says nothing when neither arm solves it: when both arms' mean
    Effectiveness on the set is under `min_effectiveness`, the verdict is "task not learned".
    """

    name: str
    a: str
    b: str
    set: str
    direction: str
    recovers: str | None = None


EFFECTS: tuple[Effect, ...] = (
    Effect(
        "HSA-SFT above Fixed-SFT on T2 (held-out Harness edits)", "fixed_sft", "hsa_sft", "t2", "+"
    ),  # fmt: skip
    Effect(
        "HSA-SFT level with Fixed-SFT on T1 (original Harness)", "fixed_sft", "hsa_sft", "t1", "="
    ),  # fmt: skip
    Effect("Fixed-SFT below the base on the general set", "base", "fixed_sft", "general", "-"),
    Effect(
        "OPD recovers most of Fixed-SFT's general loss",
        "fixed_sft",
        "fixed_sft_opd",
        "general",
        "+",
        recovers="base",
    ),  # fmt: skip
    Effect(
        "OPD recovers most of HSA-SFT's general loss",
        "hsa_sft",
        "hsa_sft_opd",
        "general",
        "+",
        recovers="base",
    ),  # fmt: skip
    Effect(
        "HSA-RL above its start (HSA-SFT + OPD) on T1",
        "hsa_sft_opd",
        "hsa_sft_opd_hsa_rl",
        "t1",
        "+",
    ),  # fmt: skip
    Effect(
        "HSA-RL above its start (HSA-SFT + OPD) on T2",
        "hsa_sft_opd",
        "hsa_sft_opd_hsa_rl",
        "t2",
        "+",
    ),  # fmt: skip
)


def parse_arms(text: str) -> tuple[str, ...]:
    """Arm names in tree order; unknown names and arms without their parent are refused."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(NODES))
    if not names or unknown:
        raise ValueError(f"arms {text!r}: unknown {unknown}; choose from {list(NODES)}")
    orphans = [n for n in names if NODES[n].parent and NODES[n].parent not in names]
    if orphans:
        raise ValueError(f"arms {text!r}: {orphans} start from an arm not listed "
                         f"({sorted({NODES[n].parent for n in orphans})})")  # fmt: skip
    return tuple(n for n in NODES if n in names)


def policy_dir(root: pathlib.Path, arm: str) -> pathlib.Path:
    """The checkpoints of the arm's own policy (its last trained stage)."""
    trained = [s for s in _pipeline.TRAINED if s in NODES[arm].stages.split(",")]
    return root / arm / trained[-1] / "checkpoints"


def eval_dir(root: pathlib.Path, arm: str) -> pathlib.Path:
    """The evaluation run of the arm's policy."""
    return root / arm / ("base/eval" if arm == "base" else "eval")


def node_config(
    c: ml_collections.ConfigDict, arm: str, root: pathlib.Path
) -> ml_collections.ConfigDict:
    """The pipeline config of one arm: `c.pipeline` with the node's stages, its input the
    parent's policy, the arm's differences (`configs.ablations`) and the shared sets."""
    node = NODES[arm]
    p = c.pipeline.copy_and_resolve_references()
    p.unlock()
    p.workdir = str(root / arm)
    p.stages = node.stages
    p.base_eval_sets = c.sets  # the base row of the table: every set
    p.eval.update(dict(sets=c.sets, sets_dir=str(root / "sets"), baseline=""))
    if node.fixed_sft:
        ablations.as_fixed_sft(p)
    if node.agentic_rl:
        ablations.as_agentic_rl(p)
    if node.parent is not None:
        parent = str(policy_dir(root, node.parent))
        base = str(policy_dir(root, "base"))
        p.sft.init.update(dict(kind="orbax", path=parent))
        p.opd.policy.update(dict(kind="orbax", path=parent))
        p.opd.teacher.update(dict(kind="orbax", path=base))  # OPD distils toward the base
        p.rl.policy.update(dict(kind="orbax", path=parent))
        p.eval.policy.update(dict(kind="jax", checkpoint=str(policy_dir(root, arm))))
        p.eval.baseline = str(eval_dir(root, node.parent))  # the node's own report: vs its start
    return p


def node_configs(
    c: ml_collections.ConfigDict, root: pathlib.Path
) -> dict[str, ml_collections.ConfigDict]:
    return {arm: node_config(c, arm, root) for arm in parse_arms(c.arms)}


def effect_verdict(
    effect: Effect,
    compared: dict[str, Any],
    margin: float,
    effectiveness: dict[str, float] | None = None,
    min_effectiveness: float = 0.0,
) -> dict[str, Any]:
    """Whether the measured comparison shows the paper's direction.

    `compared` maps "a|b" to `Bootstrap.to_dict()`s of the effect's set's "avg";
    `effectiveness` maps arms to their mean Effectiveness on the set (agent sets only).
    Verdicts: "reproduces" (the interval excludes 0 in the paper's direction, or for "=" lies
    within +-margin; with `recovers`, also at least half the loss won back), "opposite" (the
    interval excludes 0 the other way, or for "=" a difference beyond the margin), "not shown"
    (the interval holds 0, or recovery under half), "task not learned" (neither arm reaches
    `min_effectiveness` on the set) or "not run" (an arm missing).
    """
    r = compared.get(f"{effect.a}|{effect.b}")
    out: dict[str, Any] = {"effect": effect.name, "set": effect.set, "a": effect.a,
                           "b": effect.b, "direction": effect.direction, "result": r}  # fmt: skip
    if r is None or (effect.recovers and f"{effect.recovers}|{effect.a}" not in compared):
        return out | {"verdict": "not run"}
    if effectiveness:
        solved = [effectiveness.get(arm) for arm in (effect.a, effect.b)]
        out["effectiveness"] = solved
        if all(s is not None and s < min_effectiveness for s in solved):
            return out | {"verdict": "task not learned"}
    low, high = r["low"], r["high"]
    if effect.direction == "=":
        verdict = "reproduces" if -margin <= low and high <= margin else (
            "opposite" if low > 0 or high < 0 else "not shown")  # fmt: skip
        return out | {"verdict": verdict, "margin": margin}
    sign = 1.0 if effect.direction == "+" else -1.0
    lo, hi = sorted((sign * low, sign * high))
    verdict = "reproduces" if lo > 0 else ("opposite" if hi < 0 else "not shown")
    if effect.recovers:
        lost = -compared[f"{effect.recovers}|{effect.a}"]["delta"]  # recovers - a
        share = r["delta"] / lost if lost > 0 else None
        out["recovered_share"] = share
        if verdict == "reproduces" and (share is None or share < 0.5):
            verdict = "not shown"
    return out | {"verdict": verdict}


def pairs(arms: Sequence[str]) -> list[tuple[str, str]]:
    """The comparisons the report makes: each arm against its start, HSA against Fixed at each
    step, and each effect's pairs (those whose arms ran)."""
    out = [(NODES[a].parent, a) for a in arms if NODES[a].parent]
    for a in arms:
        if a.startswith("hsa_") and (twin := "fixed_" + a.removeprefix("hsa_")) in arms:
            out.append((twin, a))
    for e in EFFECTS:
        out.append((e.a, e.b))
        if e.recovers:
            out.append((e.recovers, e.a))
    seen, kept = set(), []
    for a, b in out:
        if a in arms and b in arms and (a, b) not in seen:
            seen.add((a, b))
            kept.append((a, b))
    return kept


def compare(root: pathlib.Path, arms: Sequence[str], resamples: int, seed: int) -> dict[str, Any]:
    """`{"a|b": {set: Bootstrap dict of "avg"}}` for every pair of finished arms."""
    from hat_jax.eval import compare_runs

    out = {}
    for a, b in pairs(arms):
        result = compare_runs(eval_dir(root, a), eval_dir(root, b), resamples=resamples, seed=seed)
        out[f"{a}|{b}"] = {s: m["avg"].to_dict() for s, m in result.items() if "avg" in m}
    return out


def effectiveness(root: pathlib.Path, arms: Sequence[str]) -> dict[str, dict[str, float]]:
    """`{set: {arm: mean Effectiveness}}` of the sets that score it (the agent's task)."""
    from hat_jax.eval import read_summary

    out: dict[str, dict[str, float]] = {}
    for arm in arms:
        for name, entry in read_summary(eval_dir(root, arm))["sets"].items():
            if "effectiveness" in entry["metrics"]:
                out.setdefault(name, {})[arm] = entry["metrics"]["effectiveness"]
    return out


def run_reproduce(
    c: ml_collections.ConfigDict,
    *,
    workdir: str | None = None,
    fresh: bool = False,
    mesh: Any = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs every arm of `c.arms` (complete stages skipped), then the comparisons and the
    report; returns the manifest (`<workdir>/reproduce.json`).

    Raises:
      _pipeline.StageFailed: an arm's stage failed (the manifest and report say which).
    """
    from launch import _reproduce_report

    root = pathlib.Path(workdir or c.workdir)
    if fresh and root.exists():
        import shutil

        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    configs = node_configs(c, root)
    manifest: dict[str, Any] = {
        "format": 1, "workdir": str(root), "config": c.to_dict(), "arms": {},
        "git": _pipeline.git_commit(), "status": "running", "comparisons": {},
        "effects": [],
    }  # fmt: skip
    for arm in configs:
        manifest["arms"][arm] = {"title": NODES[arm].title, "parent": NODES[arm].parent,
                                 "status": "pending", "eval": str(eval_dir(root, arm)),
                                 "policy": str(policy_dir(root, arm))}  # fmt: skip

    def write() -> None:
        manifest["updated"] = _pipeline._now()
        files.write_json(root / MANIFEST, manifest, default=str)
        _reproduce_report.write_report(root, manifest)

    write()
    for arm, p in configs.items():
        entry = manifest["arms"][arm]
        log(f"[reproduce] {arm}: {p.stages} ...")
        entry["status"] = "running"
        write()
        start = time.perf_counter()
        try:
            run = _pipeline.run_pipeline(p, workdir=p.workdir, mesh=mesh, log=log)
        except _pipeline.StageFailed as e:
            entry.update(status="failed", error=str(e))
            manifest.update(status="failed", failed_arm=arm)
            write()
            raise
        entry.update(status=run["status"], seconds=round(time.perf_counter() - start, 1),
                     stage_seconds={s: e.get("seconds") for s, e in run["entries"].items()})  # fmt: skip
        write()
    arms = list(configs)
    manifest["comparisons"] = compare(root, arms, c.resamples, c.seed)
    solved = effectiveness(root, arms)
    manifest["effects"] = [
        effect_verdict(
            e,
            {k: v[e.set] for k, v in manifest["comparisons"].items() if e.set in v},
            c.level_margin,
            solved.get(e.set),
            c.min_effectiveness,
        )  # fmt: skip
        for e in EFFECTS
    ]
    if c.edit_test.arms:
        from launch import _edit_test

        write()
        policies = {
            a.strip(): str(policy_dir(root, a.strip())) for a in c.edit_test.arms.split(",")
        }
        manifest["edit_test"] = _edit_test.run_edit_test(
            c.edit_test, eval_block=c.pipeline.eval, policies=policies, root=root,
            resamples=c.resamples, seed=c.seed, log=log)  # fmt: skip
    manifest["status"] = "complete"
    write()
    return manifest
