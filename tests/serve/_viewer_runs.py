"""Small runs of every layout the viewer reads, built in seconds with the scripted teacher and
the offline rule policy: two evaluation runs of one T1 dev set (teacher, rules), a simulator
run, a replay run, a damaged copy (a corrupt line, a comment carrying markup) and an evolution
report whose clusters point at the rules run."""

import json
import pathlib
import shutil

from hat_jax import eval as hev
from hat_jax import harness as hx
from hat_jax import livestream
from rl import sim

XSS = "<script>alert('x')</script><img src=x onerror=alert(1)>"


def _policies():
    teacher = hev.FactoryPolicy(
        lambda p, ctx: sim.ScriptedTeacher(p.scenario, p.state, ctx.world),
        describe={"kind": "teacher"}, agent_only=True,
    )  # fmt: skip
    rules = hev.FactoryPolicy(
        lambda p, ctx: livestream.RuleBasedPolicy(p.state, ctx.world),
        describe={"kind": "rules"}, agent_only=True,
    )  # fmt: skip
    return teacher, rules


def _lines(path):
    return [json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip()]


def _write_lines(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def build(root: pathlib.Path, items: int = 8) -> dict[str, pathlib.Path]:
    ctx = hev.EvalContext.default()
    t1 = hev.ensure_set("t1", ctx, sets_dir=root / "sets", split="dev", size=items)
    out = {"teacher": root / "eval-teacher", "rules": root / "eval-rules"}
    for policy, name in zip(_policies(), ("teacher", "rules"), strict=True):
        hev.evaluate([t1], policy, kinds=hev.KINDS, ctx=ctx, run_dir=out[name], progress=False)
    rules = _lines(out["rules"] / "items" / f"{t1.name}.jsonl")

    room = sim.LiveRoom(sim.SimConfig(split="dev", faults=sim.FaultConfig(timeout=0.3)))
    episodes = [room.run(room.teacher(), seed=k, sampling=hx.SamplingParams(seed=k))
                for k in range(3)]  # fmt: skip
    out["sim"] = root / "sim"
    hx.write_trajectories(out["sim"] / "trajectories.jsonl", [e.trajectory for e in episodes])
    _write_lines(out["sim"] / "episodes.jsonl", [
        {"scenario": e.scenario.id, "seed": e.seed, "harness": e.state.harness.version,
         "augmented": e.augmented, "rewards": e.rewards.to_dict(),
         "faults": [f.kind for f in e.faults]} for e in episodes
    ])  # fmt: skip

    out["replay"] = root / "replay"
    _write_lines(out["replay"] / "requests.jsonl", [
        {"run_id": "r1", "concurrency": 1, "index": k, "warmup": False, "case": r["id"],
         "latency_s": 0.5 + k, "ttft_s": 0.1, "completion_tokens": 20, "model_calls": 2,
         "success": True, "score": r["scores"]["avg"], "error": None,
         "trajectory": r["trajectory"]} for k, r in enumerate(rules[:3])
    ])  # fmt: skip
    (out["replay"] / "manifest.json").write_text(
        json.dumps({"run_id": "r1", "cases": {"set": t1.name}})
    )

    out["damaged"] = root / "eval-damaged"
    shutil.copytree(out["rules"], out["damaged"])
    damaged = [json.dumps(r, ensure_ascii=False) for r in rules]
    first = json.loads(damaged[0])
    first["trajectory"]["request"]["comments"][0]["text"] = XSS
    first["output"] = XSS
    damaged[0] = json.dumps(first, ensure_ascii=False)
    damaged.insert(2, '{"id": "broken", "scores": {"avg": 0.')  # line 3: cut mid-write
    (out["damaged"] / "items" / f"{t1.name}.jsonl").write_text("\n".join(damaged) + "\n")

    failing = [r for r in rules if r["scores"]["avg"] < 1]
    out["report"] = root / "report"
    out["report"].mkdir()
    example = lambda r: {"run_dir": str(out["rules"]), "set": r["set"], "item_id": r["id"]}
    (out["report"] / "failures.json").write_text(json.dumps({
        "format": 1, "harness_version": ctx.harness.version, "eval_run_dir": str(out["rules"]),
        "clusters": [
            {"id": "c1", "category": "effectiveness", "cause": "the reply misses the ask",
             "count": len(failing), "share": len(failing) / len(rules),
             "examples": [example(r) for r in failing]},
            {"id": "c2", "category": "tool_rationality", "cause": "a tool the gold skips",
             "count": 2, "share": 0.25,
             "examples": [example(rules[0]), {"run_dir": str(out["rules"]), "set": t1.name,
                                              "item_id": "no-such-item"}]},
        ],
        "stopping_rule": None,
    }))  # fmt: skip
    out["set"] = pathlib.Path(t1.name)
    return out
