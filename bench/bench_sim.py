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
import statistics
import time

from hat_jax import harness as hx
from hat_jax import hsa
from rl import sim


def _rate(fn, n: int, repeats: int = 3) -> tuple[float, float]:
    """(median, best) calls per second over `repeats` timed runs of `n` calls."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for k in range(n):
            fn(k)
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), max(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=300)
    args = parser.parse_args()
    n = args.episodes

    t0 = time.perf_counter()
    scenarios = sim.default_scenarios()
    print(f"scenarios: {len(scenarios)} generated in {time.perf_counter() - t0:.2f} s")
    world = hx.load_world(hx.default_world_dir())
    base = hx.load(hx.default_world_dir())

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
    rows = [
        ("episodes, HSA (all five dims)", _rate(episode(hsa_room), n)),
        ("episodes, original Harness", _rate(episode(plain_room), n)),
        ("episodes, HSA + faults", _rate(episode(fault_room), n)),
        ("augment() alone", _rate(augment, n)),
    ]
    print(f"{'per second':34s} {'median':>9s} {'best':>9s}")
    for name, (median, best) in rows:
        print(f"{name:34s} {median:9.1f} {best:9.1f}")
    with_hsa, without = rows[0][1][0], rows[1][1][0]
    print(f"HSA episode cost: {without / with_hsa:.2f}x an episode under the original Harness")
    print(f"teacher scored 1 on all four rewards in {sum(perfect)}/{len(perfect)} episodes")


if __name__ == "__main__":
    main()
