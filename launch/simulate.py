"""Run a policy through the live-room simulator and score it with the four rewards.

  python -m launch.simulate --episodes 200                       # scripted teacher, train split
  python -m launch.simulate --policy rules --split test --dims all --faults 0.1,0.1,0.05
  python -m launch.simulate --policy openai --base_url http://localhost:30000/v1 --model hat \
      --server_extensions                                        # SGLang's request fields
  python -m launch.simulate --export_scenarios runs/sim/scenarios.jsonl --episodes 0
  python -m launch.simulate --policy jax --checkpoint runs/demo/export/hf --episodes 20
  python -m launch.simulate --room micro --episodes 20           # the micro room

Each episode draws a scenario (family weights from `--proportions`), a Harness state (HSA over
`--dims`, the original for `--original_fraction` of episodes) and fault draws, runs the policy in
the Harness agent loop and scores it. `--room` (`hat_jax.livestream.ROOMS`) is the live room:
its released Harness and its scenario pool (`rl.sim.SimConfig.room`). Writes
`trajectories.jsonl`, `episodes.jsonl` (room, scenario, seed, Harness version, rewards with
reasons, injected faults), `summary.json` (mean rewards per family) and `manifest.json` (room,
released Harness, split, policy, episodes, seed) under `--out`, and prints the summary.
"""

import collections
import json
import os
import pathlib

from absl import app, flags

from hat_jax import files, livestream
from hat_jax import harness as hx
from launch import _logs
from launch import _policy as _jax
from rl import sim

_ROOM = flags.DEFINE_enum(
    "room", "v0", list(livestream.ROOMS), "Live room: released Harness and scenario pool."
)
_SPLIT = flags.DEFINE_enum("split", "train", list(sim.SPLITS), "Scenario split.")
_EPISODES = flags.DEFINE_integer("episodes", 100, "Episodes to run.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the first episode (episode k uses seed + k).")
_POLICY = flags.DEFINE_enum("policy", "teacher", ["teacher", "rules", "openai", "jax"], "Policy.")
_JAX = _jax.define_jax_flags()
_BASE_URL = flags.DEFINE_string("base_url", "http://localhost:30000/v1", "OpenAI API root.")
_MODEL = flags.DEFINE_string("model", "default", "Model name for --policy openai.")
_KEY_ENV = flags.DEFINE_string("api_key_env", "OPENAI_API_KEY", "Variable holding the API key.")
_EXTENSIONS = flags.DEFINE_bool(
    "server_extensions",
    False,
    "Send SGLang's chat_template_kwargs and separate_reasoning (not for hosted APIs).",
)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "Sampling temperature (openai, jax).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Token budget per model call.")
_THINKING = flags.DEFINE_bool("enable_thinking", True, "Ask the policy for reasoning.")
_DIMS = flags.DEFINE_string("dims", "all", "HSA dimensions: all, none, or e.g. skill_id,hook.")
_STRENGTH = flags.DEFINE_float("strength", 0.5, "HSA strength in [0, 1].")
_ORIGINAL = flags.DEFINE_float("original_fraction", 0.25, "Share of episodes on Harness v0.")
_FAULTS = flags.DEFINE_string("faults", "0,0,0", "Rates of timeout,malformed,denied faults.")
_PROPORTIONS = flags.DEFINE_string("proportions", "", "Family weights: stock=2,casual_chat=1.")
_OUT = flags.DEFINE_string("out", "runs/sim", "Output folder.")
_EXPORT = flags.DEFINE_string("export_scenarios", None, "Also write all scenarios as JSONL.")


def _config() -> sim.SimConfig:
    try:
        timeout, malformed, denied = (float(x) for x in _FAULTS.value.split(","))
    except ValueError:
        raise app.UsageError(f"--faults takes three rates, got {_FAULTS.value!r}") from None
    proportions = None
    if _PROPORTIONS.value:
        pairs = [p.split("=") for p in _PROPORTIONS.value.split(",")]
        if any(len(p) != 2 for p in pairs):
            raise app.UsageError(f"--proportions takes family=weight pairs: {_PROPORTIONS.value!r}")
        proportions = {k.strip(): float(v) for k, v in pairs}
    return sim.SimConfig(
        room=_ROOM.value,
        split=_SPLIT.value,
        proportions=proportions,
        hsa=sim.HsaConfig(
            dims=_DIMS.value, strength=_STRENGTH.value, original_fraction=_ORIGINAL.value
        ),
        faults=sim.FaultConfig(timeout=timeout, malformed=malformed, denied=denied),
    )


def _policy(room: sim.LiveRoom):
    if _POLICY.value == "teacher":
        return room.teacher()
    if _POLICY.value == "rules":
        return lambda scenario, state: livestream.RuleBasedPolicy(state, room.world)
    if _POLICY.value == "jax":
        return _jax.jax_from_flags(_JAX)
    return hx.OpenAICompatPolicy(
        base_url=_BASE_URL.value,
        model=_MODEL.value,
        api_key=os.environ.get(_KEY_ENV.value),
        server_extensions=_EXTENSIONS.value,
    )


def main(argv):
    del argv
    _logs.quiet()
    out = pathlib.Path(_OUT.value)
    if _EXPORT.value:
        pool = sim.default_scenarios(_ROOM.value)
        path = sim.write_scenarios(_EXPORT.value, pool)
        print(f"{len(pool)} scenarios of the {_ROOM.value} room written to {path}")
    room, records, trajectories = sim.LiveRoom(_config()), [], []
    released = room.harness
    print(f"Room {_ROOM.value}: Harness {released.name} {released.release} ({released.version})")
    policy = _policy(room)
    by_family = collections.defaultdict(list)
    for k in range(_EPISODES.value):
        seed = _SEED.value + k
        sampling = hx.SamplingParams(temperature=_TEMPERATURE.value, max_tokens=_MAX_TOKENS.value,
                                     enable_thinking=_THINKING.value, seed=seed)  # fmt: skip
        ep = room.run(policy, seed=seed, sampling=sampling)
        trajectories.append(ep.trajectory)
        scores = ep.rewards.to_dict()
        by_family[ep.scenario.family].append([scores[d] for d in _DIMS4])
        records.append(
            {
                "room": _ROOM.value,
                "scenario": ep.scenario.id,
                "seed": ep.seed,
                "harness": ep.state.harness.version,
                "augmented": ep.augmented,
                "rewards": scores,
                "faults": [f.kind for f in ep.faults],
            }
        )
    summary = {
        family: dict(zip(_DIMS4, (sum(col) / len(rows) for col in zip(*rows)), strict=True))
        | {"episodes": len(rows)}
        for family, rows in sorted(by_family.items())
    }
    hx.write_trajectories(out / "trajectories.jsonl", trajectories)
    files.write_text(
        out / "episodes.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    )
    files.write_text(out / "summary.json", json.dumps(summary, indent=1))
    files.write_json(out / "manifest.json", _manifest(released, len(records)))
    print(f"{'family':20s} {'n':>4s} " + " ".join(f"{d[:10]:>10s}" for d in _DIMS4))
    for family, row in summary.items():
        values = " ".join(f"{row[d]:10.3f}" for d in _DIMS4)
        print(f"{family:20s} {row['episodes']:4d} {values}")
    print(f"{len(records)} episodes written to {out}")
    if isinstance(policy, hx.OpenAICompatPolicy):
        print(f"policy endpoint: {policy.stats.to_dict()}")


_DIMS4 = ("accuracy", "effectiveness", "tool_rationality", "skill_selection")


def _manifest(released: hx.Harness, episodes: int) -> dict:
    """What the run was: the live room and its released Harness, the split, policy and seeds."""
    return {
        "room": _ROOM.value,
        "harness": {"name": released.name, "release": released.release,
                    "version": released.version},
        "split": _SPLIT.value,
        "policy": _POLICY.value,
        "episodes": episodes,
        "seed": _SEED.value,
    }  # fmt: skip


if __name__ == "__main__":
    app.run(main)
