"""How fast each layer pattern of the miniature learns to copy from its context.

The agent task needs in-context copying (a tool name from the rendered tool list, a product's
name, a viewer's handle), and a model trained from random weights on a few million tokens may
never get it (`hat_jax.eval.copy_score`). This trains fresh models of one preset on the copying
task alone (rows of random tokens shown twice, loss on the second copy; `copy_rows`) and prints
the copy accuracy of the training batches as it goes, per layer pattern: the preset as shipped
(Qwen3.5's 3 DeltaNet + 1 attention), DeltaNet and attention alternating, and every layer full
attention (the peer: a plain transformer, which learns it within a few hundred steps).

  python -m bench.bench_copy_learning [--preset tiny] [--steps 800] [--tokens 32] [--length 64]
      [--rope_theta 1e4]

Measured 2026-12-04 (the defaults: tiny, 32 tokens, 64 shown twice, 32 rows a step; 2-core
CPU, about 4 min a pattern; chance 3.1%): as shipped (DDDF) 2.7 / 6.7 / 6.2 / 6.1% at steps
100 / 300 / 400 / 800; alternating (DFDF) 2.7 / 6.3 / 5.9 / 5.9%; full attention (FFFF) 2.7 /
73.3 / 98.5 / 100.0%: ratios against it 0.06 and 0.06 at step 800. The peer's jump comes
between steps 150 and 300 depending on the run, so short runs can miss it.

RoPE theta matters as much as the layout (measured 2026-12-06, 400 steps, the same settings):
with `--rope_theta 1e4` instead of Qwen3.5's 1e7, alternating (DFDF) copies 39.9% (5.9% with
1e7), as shipped (DDDF) 6.6%; a two-layer all-attention variant of tiny (this module's
`_train`, not one of its patterns) 99.4% at step 300 with 1e4 against 33.0% with 1e7. Hence
the `micro` preset (DFDF, theta 1e4), the micro live room's policy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _patterns(num_layers: int, shipped: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    alternating = tuple(
        "full_attention" if i % 2 else "linear_attention" for i in range(num_layers)
    )
    return {
        "shipped": shipped,
        "alternating": alternating,
        "full attention": ("full_attention",) * num_layers,
    }


def _train(config, *, steps: int, tokens: int, length: int, batch: int, lr: float, log: int):
    import jax
    import optax
    from flax import nnx

    import models
    from hat_jax.eval import copy_rows

    model = models.Qwen(config, rngs=nnx.Rngs(0))
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 10), steps)
    opt = nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.1), wrt=nnx.Param)
    weights = np.zeros((batch, 2 * length - 1), np.float32)
    weights[:, length:] = 1.0  # targets of the second copy after its first token

    @nnx.jit
    def step(model, opt, rows):
        def loss_fn(model):
            logits = model(rows[:, :-1]).logits
            nll = optax.softmax_cross_entropy_with_integer_labels(logits, rows[:, 1:])
            right = logits.argmax(-1) == rows[:, 1:]
            return (nll * weights).sum() / weights.sum(), (right * weights).sum() / weights.sum()

        (loss, acc), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        opt.update(model, grads)
        return loss, acc

    ids = np.arange(100, 100 + tokens)
    curve, t0 = [], time.perf_counter()
    for i in range(steps):
        rows = copy_rows(ids, length=length, samples=batch, seed=i)
        loss, acc = step(model, opt, jax.numpy.asarray(rows))
        if (i + 1) % log == 0 or i + 1 == steps:
            curve.append((i + 1, float(loss), float(acc)))
    return curve, time.perf_counter() - t0


def main() -> None:
    import models

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--tokens", type=int, default=32, help="distinct tokens drawn from")
    parser.add_argument("--length", type=int, default=64, help="tokens per copy")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log", type=int, default=100)
    parser.add_argument("--rope_theta", type=float, default=0.0, help="0: the preset's")
    args = parser.parse_args()
    base = models.QwenConfig.preset(args.preset)
    if args.rope_theta:
        base = base.replace(rope_theta=args.rope_theta)
    if base.family != "qwen3_5_moe":
        raise SystemExit(f"--preset {args.preset}: not a Qwen3.5 hybrid (nothing to compare)")
    vocab = -(-(100 + args.tokens) // 128) * 128
    print(f"copy learning: preset {args.preset} (rope theta {base.rope_theta:g}), "
          f"{args.tokens} tokens, {args.length} shown "
          f"twice, {args.batch} rows a step, {args.steps} steps (chance "
          f"{100 / args.tokens:.1f}%)")  # fmt: skip
    results = {}
    for name, layers in _patterns(base.num_layers, tuple(base.layer_types)).items():
        config = base.replace(vocab_size=vocab, layer_types=layers)
        curve, seconds = _train(config, steps=args.steps, tokens=args.tokens,
                                length=args.length, batch=args.batch, lr=args.lr,
                                log=args.log)  # fmt: skip
        results[name] = curve[-1][2]
        marks = "  ".join(f"{s}:{100 * a:.1f}%" for s, _, a in curve)
        print(f"{name:15s} {''.join('F' if t == 'full_attention' else 'D' for t in layers)}"
              f"  copy accuracy by step  {marks}  ({seconds:.0f} s)", flush=True)  # fmt: skip
    peer = results["full attention"]
    for name in ("shipped", "alternating"):
        ratio = results[name] / peer if peer else float("nan")
        print(f"{name} / full attention at step {args.steps}: {ratio:.2f}")


if __name__ == "__main__":
    main()
