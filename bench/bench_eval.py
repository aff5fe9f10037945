"""Evaluation throughput of a local JAX policy: T1 items per second with batched decoding
(`BatchedPolicy`, every item's model calls of a round decoded together) against the same
policy run one item at a time (`batch_size=1`), on the same items, weights and greedy settings.

Both rows decode exactly the same replies (checked), so the ratio is what batching buys. Each
row first runs once to compile its shapes, then is timed; rows alternate between repeats so a
change in machine load hits both alike.

  python -m bench.bench_eval [--items 16] [--max_tokens 24] [--repeats 2]
"""

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time

from flax import nnx

import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import eval as hev
from hat_jax import host_memory


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--max_tokens", type=int, default=24)
    parser.add_argument("--max_rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    tok = load_tokenizer()
    config = models.QwenConfig.preset("tiny").replace(
        vocab_size=-(-len(tok) // 128) * 128, attention_impl="flash"
    )
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    policy = rl.JaxPolicy(model, tok, sampler=models.Sampler(model, max_length=8192))
    host_memory.retain_freed_memory()
    ctx = hev.EvalContext.default()
    ctx = dataclasses.replace(
        ctx, limits=dataclasses.replace(ctx.limits, max_rounds=args.max_rounds, budget_s=1e6)
    )
    work = tempfile.mkdtemp(prefix="bench_eval_")
    (t1,) = hev.ensure_sets(["t1"], ctx, sets_dir=f"{work}/sets", sizes={"t1": args.items})
    base = hev.RunConfig()
    sampling = dataclasses.replace(base.sampling, max_tokens=args.max_tokens)
    rows = {
        f"batched ({args.items} items together)": args.items,
        "one item at a time": 1,
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    outputs: dict[str, list[str]] = {}
    try:
        for repeat in range(args.repeats + 1):  # repeat 0 compiles
            for name, batch in rows.items():
                run_dir = f"{work}/run_{batch}_{repeat}"
                start = time.perf_counter()
                hev.evaluate([t1], hev.BatchedPolicy(policy, describe={"kind": "jax"}),
                             kinds=hev.KINDS, ctx=ctx, run_dir=run_dir, progress=False,
                             config=dataclasses.replace(base, sampling=sampling,
                                                        batch_size=batch))  # fmt: skip
                if repeat:
                    times[name].append(time.perf_counter() - start)
                outputs[name] = [r["output"] for r in hev.read_items(run_dir, "t1")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    same = len({tuple(o) for o in outputs.values()}) == 1
    print(f"T1, {args.items} items, tiny model, greedy, max_tokens={args.max_tokens}, "
          f"max_rounds={args.max_rounds}; identical replies in both rows: {same}")  # fmt: skip
    print(f"{'row':36s} {'items/s (median)':>17s} {'items/s (best)':>15s}")
    rates = {}
    for name, ts in times.items():
        rates[name] = (args.items / statistics.median(ts), args.items / min(ts))
        print(f"{name:36s} {rates[name][0]:17.2f} {rates[name][1]:15.2f}")
    batched, single = rates.values()
    print(f"batching speed-up: {batched[0] / single[0]:.2f}x (median), "
          f"{batched[1] / single[1]:.2f}x (best); target >= 4x")  # fmt: skip
    if not same:
        raise SystemExit("batched and one-at-a-time decoding gave different replies")


if __name__ == "__main__":
    main()
