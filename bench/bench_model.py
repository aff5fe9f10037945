"""Training-step speed of the Qwen3.5-MoE model: ours (JAX) vs transformers (PyTorch eager).

Both run the same mid-size `qwen3_5_moe_text` config with the same weights (a random
transformers model converted with `serve.load_hf`), float32 on CPU, one fwd+bwd step of
next-token cross-entropy plus the router load-balancing loss. Also: our MoE layer with the
sort/group dispatches ("sorted" block loop, "capacity" grid) vs the dense reference at 32
experts top-4.

Printed: median step times over interleaved repeats (the CPU may be shared, so the load
average is printed too), the ratio, model FLOP/s as a fraction of this machine's float32
matmul peak measured in the same run, the FLOP/s of JAX and torch on the batched products
that dominate our step (the routed experts' grid and a delta-rule chunk product, same
operands: how far the step ratio is bounded by the two frameworks' CPU matmul kernels), and
the dispatch ratios. Ours runs with every runtime field at its default, as a user who loads
a checkpoint gets it (on CPU: the "capacity" MoE dispatch, the two layer blocks unrolled,
no remat). On a
busy machine (other work above the core count) the ratio is not meaningful: PyTorch's
OpenMP threads slow down far more than XLA's under oversubscription, so a warning is
printed. The process keeps freed host memory
(`hat_jax.host_memory`, as the launch scripts do on CPU; it applies to both peers): without
it XLA's per-step buffers page-fault back in on every step.

    python -m bench.bench_model [--repeats 5] [--batch 4] [--length 512]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from hat_jax.host_memory import retain_freed_memory
from models import (
    Qwen,
    QwenConfig,
    capacity_experts,
    dense_experts,
    expert_capacity,
    sorted_experts,
)
from serve import load_hf

HIDDEN, LAYERS, EXPERTS, TOP_K, VOCAB = 256, 8, 32, 4, 4096


def hf_config() -> transformers.Qwen3_5MoeTextConfig:
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )


def _median_time(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def matmul_rates(repeats: int, batch: int, m: int, k: int, n: int) -> tuple[float, float]:
    """Median float32 FLOP/s of JAX and of torch on `batch` [m, k] x [k, n] products (one
    2-D product when batch is 1), the same operands for both."""
    rng = np.random.default_rng(0)
    lead = (batch,) if batch > 1 else ()
    x, y = (jnp.asarray(rng.normal(size=(*lead, *s)), jnp.float32) for s in [(m, k), (k, n)])
    f = jax.jit(lambda x, y: x @ y)
    f(x, y).block_until_ready()
    jax_t = statistics.median(_median_time(lambda: f(x, y).block_until_ready(), 3 * repeats))
    tx, ty = torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))  # writable copies
    torch_t = statistics.median(_median_time(lambda: tx @ ty, 3 * repeats))
    flops = 2.0 * batch * m * k * n
    return flops / jax_t, flops / torch_t


def matmul_peak(repeats: int, n: int = 1024) -> tuple[float, float]:
    """Median float32 matmul FLOP/s of JAX and of torch on an n x n x n product."""
    return matmul_rates(repeats, 1, n, n, n)


def model_flops(c: QwenConfig, batch: int, length: int) -> float:
    """Useful FLOPs of one fwd+bwd step (3x forward): matmuls with the top-k experts only,
    causal attention, the DeltaNet chunk products. Elementwise work is not counted."""
    tokens = batch * length
    h = c.hidden_size
    per_token = 2 * h * c.vocab_size  # LM head
    chunk = c.deltanet_chunk_size
    for kind in c.layer_types:
        if kind == "full_attention":
            q = c.num_heads * c.head_dim
            kv = c.num_kv_heads * c.head_dim
            per_token += 2 * h * (2 * q + 2 * kv) + 2 * q * h  # q, gate, k, v, o
            per_token += 2 * 2 * q * length / 2  # causal QK^T and PV
        else:
            kd = c.linear_num_key_heads * c.linear_key_head_dim
            vd = c.linear_num_value_heads * c.linear_value_head_dim
            heads, dk = c.linear_num_value_heads, c.linear_key_head_dim
            dv = c.linear_value_head_dim
            per_token += 2 * h * (2 * kd + 2 * vd + 2 * heads) + 2 * vd * h
            # Per head: KK^T, QK^T, the UT solve and its two right-hand sides (chunk-local),
            # and the state read/write of the inter-chunk scan.
            per_token += heads * (2 * 2 * chunk * dk + chunk * (dv + dk) + 2 * 3 * dk * dv)
        per_token += 2 * h * c.num_experts  # router
        per_token += 2 * 3 * h * c.moe_intermediate_size * c.num_experts_per_tok
        per_token += 2 * 3 * h * c.shared_expert_intermediate_size + 2 * h
    return 3.0 * per_token * tokens


def ours_step(model: Qwen, ids: np.ndarray):
    graphdef, state = nnx.split(model)
    coef = model.config.router_aux_loss_coef

    @jax.jit
    def step(state, ids):
        def loss_fn(state):
            out = nnx.merge(graphdef, state)(ids)
            logp = jax.nn.log_softmax(out.logits[:, :-1].astype(jnp.float32))
            nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()
            return nll + coef * out.aux_loss

        return jax.value_and_grad(loss_fn)(state)

    ids = jnp.asarray(ids)
    start = time.perf_counter()
    jax.block_until_ready(step(state, ids))
    compile_s = time.perf_counter() - start
    return (lambda: jax.block_until_ready(step(state, ids))), compile_s


def torch_step(model: torch.nn.Module, ids: np.ndarray):
    ids = torch.from_numpy(ids.astype(np.int64))
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids, output_router_logits=True, use_cache=False)
        out.loss.backward()

    return step


def dispatch_bench(repeats: int, tokens: int) -> dict[str, float]:
    """Median fwd+bwd seconds of the routed-expert part alone, per dispatch."""
    rng = np.random.default_rng(0)
    f = 128
    x = jnp.asarray(rng.normal(size=(tokens, HIDDEN)), jnp.float32)
    weights = [
        jnp.asarray(rng.normal(size=s) * 0.05, jnp.float32)
        for s in [(EXPERTS, HIDDEN, 2, f), (EXPERTS, f, HIDDEN)]
    ]
    idx = jnp.asarray(np.argsort(rng.random((tokens, EXPERTS)), 1)[:, :TOP_K], jnp.int32)
    w = jnp.full((tokens, TOP_K), 1.0 / TOP_K, jnp.float32)
    default = QwenConfig.preset("tiny")  # the default block size and capacity factor
    block, factor = default.moe_block_size, default.moe_capacity_factor
    grads = {}
    for name, fn in {
        "dense": dense_experts,
        "sorted": functools.partial(sorted_experts, block_size=block),
        "capacity": functools.partial(capacity_experts, capacity_factor=factor, block_size=block),
    }.items():
        loss = lambda x, ws, idx, w, fn=fn: fn(x, idx, w, *ws).sum()  # noqa: E731
        grads[name] = jax.jit(jax.grad(loss, argnums=(0, 1)))
        jax.block_until_ready(grads[name](x, weights, idx, w))
    times = {name: [] for name in grads}
    for _ in range(repeats):
        for name, grad in grads.items():
            times[name] += _median_time(
                lambda g=grad: jax.block_until_ready(g(x, weights, idx, w)), 1
            )
    return {name: statistics.median(t) for name, t in times.items()}


def kernel_shapes(c: QwenConfig, batch: int, length: int) -> dict[str, tuple[int, ...]]:
    """(batch, m, k, n) of the batched products that dominate our step: the routed experts'
    gate/up product on the capacity grid, and a delta-rule chunk product (K K^T)."""
    rows = batch * length * c.num_experts_per_tok
    cap = expert_capacity(rows, c.num_experts, c.moe_capacity_factor)
    chunk, dk = c.deltanet_chunk_size, c.linear_key_head_dim
    chunks = batch * c.linear_num_value_heads * -(-length // chunk)
    return {
        "expert grid": (c.num_experts, cap, c.hidden_size, 2 * c.moe_intermediate_size),
        "delta-rule chunk": (chunks, chunk, dk, chunk),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--runtime", default="", help="QwenConfig runtime overrides for ours, "
                        "e.g. moe_dispatch=sorted,scan_unroll=1 (default: the defaults)")  # fmt: skip
    args = parser.parse_args()
    runtime = {k: (int(v) if v.isdigit() else v)
               for k, v in (kv.split("=", 1) for kv in args.runtime.split(",") if kv)}  # fmt: skip
    retained = retain_freed_memory(True)  # before any large allocation, for both peers
    torch.manual_seed(0)
    load_before = os.getloadavg()

    hf = transformers.AutoModelForCausalLM.from_config(hf_config())
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        # The defaults: on CPU they resolve to the "capacity" MoE dispatch and every block
        # of the layer scan unrolled (`QwenConfig.resolved`); `model.config` says which.
        _, model = load_hf(tmp, dtype="float32", **runtime)
        config = model.config
    ids = np.random.default_rng(0).integers(0, VOCAB, (args.batch, args.length))

    ours, compile_s = ours_step(model, ids)
    theirs = torch_step(hf, ids)
    theirs()  # warm-up
    ours_t, theirs_t = [], []
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        ours_t += _median_time(ours, 1)
        theirs_t += _median_time(theirs, 1)
    jax_peak, torch_peak = matmul_peak(args.repeats)
    kernels = kernel_shapes(config, args.batch, args.length)
    rates = {name: matmul_rates(args.repeats, *shape) for name, shape in kernels.items()}
    dispatch = dispatch_bench(args.repeats, args.batch * args.length)
    load_after = os.getloadavg()

    flops = model_flops(config, args.batch, args.length)
    ours_s, theirs_s = statistics.median(ours_t), statistics.median(theirs_t)
    best = min(theirs_t) / min(ours_t)
    impl = hf.config._experts_implementation, hf.config._attn_implementation
    print(f"config: qwen3_5_moe_text hidden {HIDDEN}, {LAYERS} layers "
          f"({config.layer_types.count('linear_attention')} DeltaNet), {EXPERTS} experts "
          f"top-{TOP_K}, batch {args.batch} x {args.length} tokens, float32, CPU "
          f"({os.cpu_count()} cores); transformers experts={impl[0]} attention={impl[1]}")  # fmt: skip
    print(f"ours: moe_dispatch={config.moe_dispatch} "
          f"moe_capacity_factor={config.moe_capacity_factor} moe_block_size={config.moe_block_size} "
          f"deltanet_chunk_size={config.deltanet_chunk_size} remat={config.remat} "
          f"scan_unroll={config.scan_unroll}")  # fmt: skip
    print(f"host memory retained (glibc malloc keeps freed blocks): {retained}")
    print(f"load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f}; "
          f"medians of {args.repeats} interleaved steps")  # fmt: skip
    cores = os.cpu_count() or 1  # the run itself keeps about `cores` threads busy
    if load_before[0] > cores or load_after[0] > 2 * cores:
        print("WARNING: the machine was busy (load average above the core count): the ratio "
              "below is not a valid measurement; rerun on an idle machine")  # fmt: skip
    print(f"matmul peak (fp32, 1024^3): jax {jax_peak / 1e9:.1f} GFLOP/s, "
          f"torch {torch_peak / 1e9:.1f} GFLOP/s")  # fmt: skip
    for name, (jax_rate, torch_rate) in rates.items():
        b, m, k, n = kernels[name]
        print(f"{name} products ({b} x [{m}, {k}] x [{k}, {n}]): jax {jax_rate / 1e9:.1f} "
              f"GFLOP/s, torch {torch_rate / 1e9:.1f} GFLOP/s ({jax_rate / torch_rate:.2f}x)")  # fmt: skip
    print(f"model FLOPs per fwd+bwd step: {flops / 1e9:.1f} GFLOP")
    print(f"ours (JAX, {config.moe_dispatch} dispatch): {ours_s * 1e3:8.1f} ms  "
          f"{flops / ours_s / 1e9:6.1f} GFLOP/s = {flops / ours_s / jax_peak:.0%} of peak "
          f"(compile {compile_s:.1f} s)")  # fmt: skip
    print(
        f"transformers (torch eager): {theirs_s * 1e3:8.1f} ms  "
        f"{flops / theirs_s / 1e9:6.1f} GFLOP/s = {flops / theirs_s / torch_peak:.0%} of peak"
    )
    print(f"speed-up ours vs transformers: {theirs_s / ours_s:.2f}x of medians, {best:.2f}x of "
          "best steps (target >= 1.5x)")  # fmt: skip
    for name in ("sorted", "capacity"):
        print(f"MoE experts fwd+bwd, {args.batch * args.length} tokens: dense "
              f"{dispatch['dense'] * 1e3:.1f} ms, {name} {dispatch[name] * 1e3:.1f} ms, "
              f"speed-up {dispatch['dense'] / dispatch[name]:.2f}x (target >= 3x)")  # fmt: skip


if __name__ == "__main__":
    main()
