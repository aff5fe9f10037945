"""SFT train-step throughput: tokens/s and model FLOP utilisation, and the memory plan.

  python -m bench.bench_sft [--repeats 7] [--only demo|mid|attention] [--no-plan]

For the demo model (tiny Qwen3.5-MoE, the demo tokenizer's vocabulary) and the mid-size config
of `bench_model` (hidden 256, 8 layers, 32 experts top-4, seq 512, batch 4), both fp32 on one
CPU device: the full `make_train_step` (SFT loss with masking and the aux loss, global-norm
clipping, AdamW, the non-finite guard, donated state) against its peer, the model's bare
forward+backward (`bench_model`'s step), and the model FLOPs utilisation against this
machine's float32 matmul peak. Then the demo's own SFT step (2 rows of 5,376 tokens) with
this backend's default attention (`QwenConfig.resolved`: block-wise on CPU) against the dense
[T, T] scores (the default before), as a speed ratio.

The machine may be shared, so nothing is timed alone: everything is compiled and warmed up
first, then timed in interleaved rounds (one call of each per round), each round also
probing the matmul peak; a round's MFU divides its step time by the peak probed seconds
before, and the table gives the median over rounds with its range. Then the memory plan of
the production config (`launch.plan` on 8 x 96 GB and 16 x 80 GB), in its own process.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.bench_model import hf_config, model_flops, ours_step
from hat_jax import sharding, train
from models import Qwen, QwenConfig


def matmul_peak_fn(n: int = 1024) -> tuple[Callable[[], None], float]:
    """A float32 n x n x n JAX matmul (compiled) and its FLOPs: the peak's probe."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    return (lambda: f(a).block_until_ready()), 2.0 * n**3


def sft_step_fn(config: QwenConfig, batch: int, length: int) -> Callable[[], None]:
    """One full SFT train step on one device, compiled and warmed up: call it to time it."""
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    sft = train.SFTConfig(
        trainer=train.TrainerConfig(total_steps=1, batch_size=batch, seq_len=length),
        optimizer=train.OptimizerConfig(learning_rate=1e-4),
        aux_loss_coef=config.router_aux_loss_coef,
    )
    with tempfile.TemporaryDirectory() as scratch:
        driver = train.sft_driver(sft, model_fn=lambda: Qwen(config, rngs=nnx.Rngs(0)),
                                  run_dir=scratch, mesh=mesh)  # fmt: skip
    state, step = driver.initial_state(), driver.step_fn
    source = train.SyntheticTokenSource(
        batch_size=batch, seq_len=length, vocab_size=config.vocab_size
    )
    data = sharding.global_batch(next(source), mesh)
    box = [state]

    def run():
        box[0], metrics = step(box[0], data)
        jax.block_until_ready(metrics["loss"])

    run()
    return run


def model_step_fn(config: QwenConfig, batch: int, length: int) -> Callable[[], None]:
    """The model's bare forward+backward (the peer), compiled and warmed up."""
    model = Qwen(config, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, length))
    fn, _ = ours_step(model, ids)
    fn()
    return fn


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(fns: dict[str, Callable[[], None]], repeats: int, peak_probes: int = 3):
    """Seconds per call of every fn, one call each per round, round after round.

    Each round also probes the matmul peak (`peak` key: the fastest of `peak_probes` calls,
    the machine's best rate at that moment), so a figure and the peak it is divided by are
    measured seconds apart, under the same load from other processes.
    """
    peak_fn, _ = matmul_peak_fn()
    times: dict[str, list[float]] = {name: [] for name in ("peak", *fns)}
    for _ in range(repeats):
        times["peak"].append(min(_timed(peak_fn) for _ in range(peak_probes)))
        for name, fn in fns.items():
            times[name].append(_timed(fn))
    return times


def _spread(values: list[float]) -> str:
    """median [min, max] of per-round values, as percentages."""
    return f"{statistics.median(values):6.1%} [{min(values):.0%}, {max(values):.0%}]"


# The demo's SFT step: 2 rows of 5,376 tokens (configs/pipeline_demo.py), one conversation each.
DEMO_ROW = (2, 5376)


def _configs() -> list[tuple[str, QwenConfig, int, int]]:
    from data.tokenizer import load_tokenizer

    vocab = -(-len(load_tokenizer(None)) // 128) * 128
    demo = QwenConfig.preset("tiny", vocab_size=vocab)
    mid = QwenConfig.from_hf(hf_config().to_dict(), moe_dispatch="sorted")
    return [("demo (tiny, seq 2048, batch 2)", demo, 2, 2048),
            ("mid-size (seq 512, batch 4)", mid, 4, 512)]  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_sft")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=("demo", "mid", "attention"), help="one part only")
    parser.add_argument("--no-plan", action="store_true", help="skip the memory plan")
    args = parser.parse_args(argv)
    all_configs = _configs()
    configs = [c for c in all_configs if args.only is None or c[0].startswith(args.only)]
    demo = all_configs[0][1]
    fns = {}
    for name, config, batch, length in configs:
        fns[f"{name}/step"] = sft_step_fn(config, batch, length)
        fns[f"{name}/bare"] = model_step_fn(config, batch, length)
    attention = args.only in (None, "attention")
    if attention:  # the default attention of this backend against the dense [T, T] scores
        fns["row/default"] = sft_step_fn(demo, *DEMO_ROW)
        fns["row/dense"] = sft_step_fn(demo.replace(attention_impl="dense"), *DEMO_ROW)
    load = os.getloadavg()[0]
    times = interleaved(fns, args.repeats)
    _, peak_flops = matmul_peak_fn()
    peaks = [peak_flops / t for t in times["peak"]]
    print(f"{args.repeats} interleaved rounds (load average {load:.1f} -> "
          f"{os.getloadavg()[0]:.1f}); matmul peak (fp32, 1024^3, best of 3 per round): "
          f"median {statistics.median(peaks) / 1e9:.1f} GFLOP/s "
          f"[{min(peaks) / 1e9:.1f}, {max(peaks) / 1e9:.1f}]")  # fmt: skip
    if configs:
        print(f"{'config':30s} {'tokens/s':>9s} {'step s':>7s} {'MFU median [min, max]':>22s} "
              f"{'step/fwd+bwd':>12s}")  # fmt: skip
    for name, config, batch, length in configs:
        step, bare = times[f"{name}/step"], times[f"{name}/bare"]
        flops = model_flops(config, batch, length)
        # per round: the step against the peak probed in the same round
        mfu = [flops / s / p for s, p in zip(step, peaks, strict=True)]
        ratio = statistics.median(s / b for s, b in zip(step, bare, strict=True))
        median_step = statistics.median(step)
        print(f"{name:30s} {batch * length / median_step:9.0f} {median_step:7.3f} "
              f"{_spread(mfu):>22s} {ratio:11.2f}x", flush=True)  # fmt: skip
    if attention:
        resolved = demo.resolved()
        default, dense = times["row/default"], times["row/dense"]
        ratio = statistics.median(d / a for a, d in zip(default, dense, strict=True))
        print(f"\nthe demo's SFT step ({DEMO_ROW[0]} x {DEMO_ROW[1]:,} tokens, tiny): default "
              f"attention ({resolved.attention_impl}, blocks of {resolved.attention_block_size})"
              f" {statistics.median(default):.2f} s, dense [T, T] scores "
              f"{statistics.median(dense):.2f} s: {ratio:.2f}x faster", flush=True)  # fmt: skip
    if not args.no_plan:
        print("\nmemory plan, Qwen3.6-35B-A3B full SFT, 8K tokens per device (launch.plan):",
              flush=True)  # fmt: skip
        cmd = [sys.executable, "-m", "launch.plan", "--config=configs/sft_qwen3_6_35b_a3b.py"]
        return subprocess.call(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
