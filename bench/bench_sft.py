"""SFT train-step throughput: tokens/s and model FLOP utilisation, and the memory plan.

  python -m bench.bench_sft [--repeats 5] [--no-plan]

For the demo model (tiny Qwen3.5-MoE, the demo tokenizer's vocabulary) and the mid-size config
of `bench_model` (hidden 256, 8 layers, 32 experts top-4, seq 512, batch 4), both fp32 on one
CPU device: the full `make_train_step` (SFT loss with masking and the aux loss, global-norm
clipping, AdamW, the non-finite guard, donated state) against its peer measured in the same
run, the model's bare forward+backward (`bench_model`'s step), and the model FLOPs utilisation
against this machine's float32 matmul peak (also measured here). Then the memory plan of the
production config (`launch.plan`, FSDP on 8 x 96 GB and 16 x 80 GB), in its own process.
"""

import argparse
import functools
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.bench_model import hf_config, model_flops, ours_step
from hat_jax import sharding, train
from models import Qwen, QwenConfig


def matmul_peak(n: int = 1024, repeats: int = 15) -> float:
    """Median float32 FLOP/s of an n x n x n JAX matmul on this machine."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f(a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def _median(fn, repeats: int) -> float:
    fn()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sft_step_seconds(config: QwenConfig, batch: int, length: int, repeats: int) -> float:
    """Median seconds of one full SFT train step on one device."""
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    model_fn = lambda: Qwen(config, rngs=nnx.Rngs(0))  # noqa: E731
    graphdef, params, rest = train.abstract_split(model_fn, mesh)
    optimizer = train.make_optimizer(train.OptimizerConfig(learning_rate=1e-4), params)
    abstract = train.abstract_train_state(params, rest, optimizer, mesh)
    _, state = train.init_train_state(
        sharding.init_sharded(model_fn, mesh), optimizer, mesh, seed=0
    )
    step = train.make_train_step(
        functools.partial(train.sft_loss, aux_loss_coef=config.router_aux_loss_coef),
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=sharding.shardings_of(abstract),
        batch_shardings=train.batch_shardings_for(mesh),
    )
    source = train.SyntheticTokenSource(
        batch_size=batch, seq_len=length, vocab_size=config.vocab_size
    )
    data = sharding.global_batch(next(source), mesh)
    box = [state]

    def run():
        box[0], metrics = step(box[0], data)
        jax.block_until_ready(metrics["loss"])

    return _median(run, repeats)


def model_step_seconds(config: QwenConfig, batch: int, length: int, repeats: int) -> float:
    """Median seconds of the model's bare forward+backward (the peer)."""
    model = Qwen(config, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, length))
    fn, _ = ours_step(model, ids)
    return _median(fn, repeats)


def _configs() -> list[tuple[str, QwenConfig, int, int]]:
    from data.tokenizer import load_tokenizer

    vocab = -(-len(load_tokenizer(None)) // 128) * 128
    demo = QwenConfig.preset("tiny", vocab_size=vocab)
    mid = QwenConfig.from_hf(hf_config().to_dict(), moe_dispatch="sorted")
    return [("demo (tiny, seq 2048, batch 2)", demo, 2, 2048),
            ("mid-size (seq 512, batch 4)", mid, 4, 512)]  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_sft")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-plan", action="store_true", help="skip the memory plan")
    args = parser.parse_args(argv)
    peak = matmul_peak()
    print(f"matmul peak (fp32, 1024^3, jax): {peak / 1e9:.1f} GFLOP/s")
    print(f"{'config':34s} {'tokens/s':>10s} {'step s':>8s} {'MFU':>6s} {'fwd+bwd s':>10s} "
          f"{'step/fwd+bwd':>12s}")  # fmt: skip
    for name, config, batch, length in _configs():
        step_s = sft_step_seconds(config, batch, length, args.repeats)
        bare_s = model_step_seconds(config, batch, length, args.repeats)
        mfu = model_flops(config, batch, length) / step_s / peak
        print(f"{name:34s} {batch * length / step_s:10.0f} {step_s:8.3f} {mfu:6.1%} "
              f"{bare_s:10.3f} {step_s / bare_s:12.2f}x", flush=True)  # fmt: skip
    if not args.no_plan:
        print("\nmemory plan, Qwen3.6-35B-A3B full SFT, 8K tokens per device (launch.plan):",
              flush=True)  # fmt: skip
        cmd = [sys.executable, "-m", "launch.plan", "--config=configs/sft_qwen3_6_35b_a3b.py",
               "--layouts=fsdp"]  # fmt: skip
        return subprocess.call(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
