"""Data-pipeline throughput against the tiny model's SFT step, measured in the same run.

The pipeline must never starve training. This benchmark builds a small teacher corpus with the
scripted teacher (`data.write_corpus`, ArrayRecord shards), then measures:

- pipeline throughput: batches from `data.sft_data` (read, decode, render with loss masks,
  pack, batch) in row positions per second (what a step consumes) and real (non-padding)
  tokens per second; without online HSA, with online HSA on half the records and on every
  record, and with two worker processes;
- the peer: the tiny Qwen's full SFT step (`hat_jax.train.make_train_step` with `sft_loss`,
  AdamW) on the same batches, in row positions per second.

The ratio pipeline / step is the headroom (target >= 10x). Run: `python -m bench.bench_pipeline`
(or `make bench`); `--quick` for a shorter run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
from flax import nnx

import data
from data.tokenizer import load_tokenizer
from hat_jax import sharding, train
from models import Qwen, QwenConfig


def _corpus(directory: str, num_scenarios: int) -> None:
    config = data.CorpusConfig(num_scenarios=num_scenarios, states_per_scenario=2, seed=0)
    data.write_corpus(config, directory, num_shards=2)


def _pipeline(directory, tokenizer, *, seq_len, batch, hsa=0.0, workers=0):
    config = data.PipelineConfig(
        sources=(directory,),
        split="train",
        seq_len=seq_len,
        global_batch_size=batch,
        online_hsa=data.OnlineHSAConfig(probability=hsa),
        worker_count=workers,
    )
    return data.sft_data(config, tokenizer=tokenizer, process_index=0, process_count=1)


def measure_pipeline(directory, tokenizer, *, seq_len, batch, batches, **kw) -> dict:
    it = _pipeline(directory, tokenizer, seq_len=seq_len, batch=batch, **kw)
    try:
        next(it)  # start-up (worker processes, first reads) is not throughput
        before = it.stats()
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        seconds = time.perf_counter() - t0
        after = it.stats()
    finally:
        it.close()
    slots = after["slots"] - before["slots"]
    tokens = after["tokens"] - before["tokens"]
    return {
        "positions_per_s": slots / seconds,
        "tokens_per_s": tokens / seconds,
        "padding": 1 - tokens / slots,
        "hsa_applied": after["hsa_applied"],
        "records": after["records"],
    }


def measure_step(batches: list[dict], vocab: int, steps: int) -> dict:
    config = QwenConfig.preset("tiny").replace(vocab_size=vocab)

    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    rows, length = batches[0]["input_ids"].shape
    sft = train.SFTConfig(
        trainer=train.TrainerConfig(total_steps=1, batch_size=rows, seq_len=length),
        optimizer=train.OptimizerConfig(learning_rate=1e-4),
    )
    with tempfile.TemporaryDirectory() as scratch:
        driver = train.sft_driver(sft, model_fn=lambda: Qwen(config, rngs=nnx.Rngs(0)),
                                  run_dir=scratch, mesh=mesh)  # fmt: skip
    state, step = driver.initial_state(), driver.step_fn
    device_batches = [sharding.global_batch(b, mesh) for b in batches]
    state, metrics = step(state, device_batches[0])  # compile
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for i in range(steps):
        state, metrics = step(state, device_batches[(i + 1) % len(device_batches)])
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - t0
    slots = sum(b["input_ids"].size for b in batches[1:2]) * steps
    return {"positions_per_s": slots / seconds, "step_s": seconds / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and steps")
    parser.add_argument("--seq_len", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    n = 8 if args.quick else 24
    tokenizer = load_tokenizer()
    with tempfile.TemporaryDirectory() as directory:
        t0 = time.perf_counter()
        _corpus(directory, 40 if args.quick else 80)
        print(f"corpus: {time.perf_counter() - t0:.1f} s for {os.listdir(directory)}")
        shape = dict(seq_len=args.seq_len, batch=args.batch)
        rows = {
            "pipeline, stored": measure_pipeline(directory, tokenizer, batches=n, **shape),
            "pipeline, online HSA 50%": measure_pipeline(
                directory, tokenizer, batches=n, hsa=0.5, **shape
            ),
            "pipeline, online HSA 100%": measure_pipeline(
                directory, tokenizer, batches=n, hsa=1.0, **shape
            ),
            "pipeline, online HSA 100%, 2 workers": measure_pipeline(
                directory, tokenizer, batches=2 * n, hsa=1.0, workers=2, **shape
            ),
        }
        it = _pipeline(directory, tokenizer, **shape)
        batches = [next(it) for _ in range(4)]
    step = measure_step(batches, len(tokenizer), steps=2 if args.quick else 4)
    print(f"\nrows of {args.seq_len} tokens, batch {args.batch}; CPU: {os.cpu_count()} cores")
    print(
        f"tiny Qwen SFT step: {step['step_s'] * 1e3:.0f} ms/step, "
        f"{step['positions_per_s']:,.0f} positions/s consumed\n"
    )
    print(f"{'source':40s} {'positions/s':>12s} {'tokens/s':>10s} {'padding':>8s} {'x step':>7s}")
    for name, r in rows.items():
        ratio = r["positions_per_s"] / step["positions_per_s"]
        print(
            f"{name:40s} {r['positions_per_s']:12,.0f} {r['tokens_per_s']:10,.0f} "
            f"{r['padding']:8.1%} {ratio:7.1f}"
        )
    worst = min(r["positions_per_s"] for r in rows.values()) / step["positions_per_s"]
    print(f"\nslowest pipeline / step = {worst:.1f}x (target >= 10x)")


if __name__ == "__main__":
    main()
