"""Guardrail false positives on the live-room simulator's scenarios.

Runs every scenario of every split once with the scripted teacher (under the Harness state the
room draws for it, HSA included) and once with the offline rule policy under Harness v0, and
counts what the guardrails did to requests that are not attacks (scenarios without an
`injection` intent): a request flagged as an injection, a guardrail hook that retried or
blocked, a teacher episode that no longer scores 1 on all four rewards. Attack scenarios are
counted apart (they must be flagged). `--dump` writes per-scenario records, `--compare` diffs
them with an earlier dump (e.g. before a hooks.yaml change): teacher trajectories, flags and
hook events that changed.

  python -m bench.bench_guardrails [--dump runs/guardrails.json] [--compare old.json]
"""

import argparse
import hashlib
import json
import time

from hat_jax import harness as hx
from hat_jax import livestream
from rl import sim

GUARDRAILS = frozenset(
    {
        "normalize_input",
        "detect_injection",
        "injection_guard",
        "sanitize_tool_output",
        "forbidden_claims",
        "factual_risk",
        "no_prompt_leak",
    }
)


def _record(ep: sim.Episode, rules: hx.Trajectory) -> dict:
    t, r = ep.trajectory, ep.rewards
    blob = json.dumps(
        [
            t.messages,
            t.final.public,
            t.final.private,
            [(c.name, c.arguments) for c in t.tool_calls],
        ],
        sort_keys=True,
        default=str,
    )
    return {
        "attack": any(i.kind == "injection" for i in ep.scenario.gold.intents),
        "teacher_flags": t.request["flags"],
        "teacher_events": [[e.point, e.hook, e.outcome] for e in t.hook_events],
        "teacher_digest": hashlib.sha256(blob.encode()).hexdigest()[:16],
        "teacher_rewards": [r.accuracy, r.effectiveness, r.tool_rationality, r.skill_selection],
        "rules_flags": rules.request["flags"],
        "rules_events": [[e.point, e.hook, e.outcome] for e in rules.hook_events],
        "rules_spoken": rules.spoken,
    }


def _stopped(events) -> bool:
    return any(hook in GUARDRAILS and outcome in ("retry", "block") for _, hook, outcome in events)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", default="")
    parser.add_argument("--compare", default="")
    args = parser.parse_args()
    world = livestream.load_world(livestream.default_world_dir())
    base = hx.load(livestream.default_world_dir())
    scenarios, v0 = sim.default_scenarios(), hx.HarnessState(harness=base)
    tools = livestream.builtin_toolbox(world)
    records, start = {}, time.perf_counter()
    for split in ("train", "dev", "test"):
        room = sim.LiveRoom(
            sim.SimConfig(split=split), world=world, harness=base, scenarios=scenarios
        )
        for k, s in enumerate(room.scenarios):
            ep = room.run(room.teacher(), s, seed=k)
            rules = hx.run_agent(v0, room.request(s), livestream.RuleBasedPolicy(v0, world), tools)
            records[s.id] = _record(ep, rules)
    benign = [r for r in records.values() if not r["attack"]]
    attacks = [r for r in records.values() if r["attack"]]
    rows = [
        ("scenarios", len(records)),
        ("benign scenarios", len(benign)),
        ("benign, teacher flagged", sum(bool(r["teacher_flags"]) for r in benign)),
        ("benign, rule policy flagged", sum(bool(r["rules_flags"]) for r in benign)),
        (
            "benign, teacher stopped by a guardrail",
            sum(_stopped(r["teacher_events"]) for r in benign),
        ),
        (
            "benign, rule policy stopped by a guardrail",
            sum(_stopped(r["rules_events"]) for r in benign),
        ),
        (
            "teacher below 1 on any reward",
            sum(r["teacher_rewards"] != [1, 1, 1, 1] for r in records.values()),
        ),
        ("attack scenarios", len(attacks)),
        ("attack scenarios flagged (teacher)", sum(bool(r["teacher_flags"]) for r in attacks)),
    ]
    for name, value in rows:
        print(f"{name:45s} {value}")
    print(f"{'seconds':45s} {time.perf_counter() - start:.1f}")
    if args.compare:
        with open(args.compare, encoding="utf-8") as f:
            old = json.load(f)
        for field in (
            "teacher_flags",
            "teacher_events",
            "teacher_digest",
            "rules_flags",
            "rules_events",
            "rules_spoken",
        ):
            changed = sum(old[k].get(field) != r[field] for k, r in records.items() if k in old)
            print(f"{'changed vs ' + args.compare + ': ' + field:45s} {changed}")
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            json.dump(records, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
