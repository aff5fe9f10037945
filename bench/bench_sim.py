"""Live-room simulator throughput: scripted-teacher episodes per second.

One episode is everything an HSA-RL rollout costs outside the model: sample a scenario, draw a
Harness state (HSA over all five dimensions), build the sandbox, run the Harness agent loop
with the scripted teacher, score the four rewards and cut the segments. Peers measured in the
same run, on the same scenarios and seeds:

- the same episodes under the original Harness (no augmentation): what HSA costs per episode;
- the same episodes with fault injection (10% timeouts, 10% malformed results, 5% denials);
- `augment` alone (Harness states per second).

  python -m bench.bench_sim [--episodes 300]
"""

import argparse
import os
import statistics
import time

from hat_jax import harness as hx
from hat_jax import hsa, livestream
from rl import sim


def _rates(rows, n: int, repeats: int = 3) -> list[tuple[float, float]]:
    """(median, best) calls per second of each row's `fn`, `repeats` timed runs of `n` calls.
    Rows are interleaved within each repeat, so a change in machine load hits all alike."""
    rates: list[list[float]] = [[] for _ in rows]
    for _ in range(repeats):
        for i, (_, fn) in enumerate(rows):
            start = time.perf_counter()
            for k in range(n):
                fn(k)
            rates[i].append(n / (time.perf_counter() - start))
    return [(statistics.median(r), max(r)) for r in rates]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=300)
    args = parser.parse_args()
    n = args.episodes

    t0 = time.perf_counter()
    scenarios = sim.default_scenarios()
    print(f"scenarios: {len(scenarios)} generated in {time.perf_counter() - t0:.2f} s")
    world = livestream.load_world(livestream.default_world_dir())
    base = hx.load(livestream.default_world_dir())

    def room(**cfg) -> sim.LiveRoom:
        return sim.LiveRoom(sim.SimConfig(**cfg), world=world, harness=base, scenarios=scenarios)

    hsa_room = room(hsa=sim.HsaConfig(original_fraction=0.0))
    plain_room = room(hsa=sim.HsaConfig(dims="none"))
    fault_room = room(
        hsa=sim.HsaConfig(original_fraction=0.0),
        faults=sim.FaultConfig(timeout=0.1, malformed=0.1, denied=0.05),
    )
    picks = [hsa_room.sample(k) for k in range(n)]
    perfect = []

    def episode(r: sim.LiveRoom):
        def run(k: int) -> None:
            ep = r.run(r.teacher(), picks[k], seed=k)
            ep.segments()
            perfect.append(ep.rewards.as_array().min() == 1.0)

        return run

    def augment(k: int) -> None:
        hsa.augment(base, seed=k, preserve=picks[k].needs)

    for r in (hsa_room, plain_room, fault_room):  # warm caches (requests, prompts, validators)
        for k in range(min(n, 50)):
            episode(r)(k)
    perfect.clear()
    named = [
        ("episodes, HSA (all five dims)", episode(hsa_room)),
        ("episodes, original Harness", episode(plain_room)),
        ("episodes, HSA + faults", episode(fault_room)),
        ("augment() alone", augment),
    ]
    rows = list(zip([name for name, _ in named], _rates(named, n)))
    print(f"{'per second':34s} {'median':>9s} {'best':>9s}")
    for name, (median, best) in rows:
        print(f"{name:34s} {median:9.1f} {best:9.1f}")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with_hsa, without = rows[0][1][0], rows[1][1][0]
    print(f"HSA episode cost: {without / with_hsa:.2f}x an episode under the original Harness")
    print(f"teacher scored 1 on all four rewards in {sum(perfect)}/{len(perfect)} episodes")


if __name__ == "__main__":
    main()
