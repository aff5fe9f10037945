"""Decoding speed: our `models.Sampler` vs transformers `generate`, the memory-bandwidth floor,
and self-speculative vs plain decoding.

Both run the mid-size `qwen3_5_moe_text` config of `bench_model` with the same weights (a
random transformers model converted with `serve.load_hf`), float32 on CPU, greedy, batch 8,
a 64-token prompt and 128 new tokens (no stop token). Tokens/s counts generated tokens over
the whole call (prefill included, as a rollout sees it). Peers are measured in the same run,
interleaved; medians are printed with the load average (the CPU may be shared).

The floor: one decode step must read every parameter once (batch 8 x top-4 routing touches
most of the 32 experts; counted as all of them) plus the KV and DeltaNet caches, so
step time >= bytes / memory bandwidth; the bandwidth is measured here with a large array copy.

Speculative decoding uses a random MTP head (the policy here is random too, so there is no
trained head to adapt from); a random head's drafts are almost never accepted, so this part
shows the drafting overhead and that the greedy tokens do not change. An adapted head's
acceptance comes from the MTP adaptation stage (`python -m launch.mtp`), which reports it.

    python -m bench decode     # or: python -m bench.bench_decode [--repeats 3] [--skip_speculative]
"""

from __future__ import annotations

import argparse
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

from bench.bench_model import HIDDEN, LAYERS, hf_config
from models import GREEDY, MTPHead, Sampler
from serve import load_hf

BATCH, PROMPT, NEW = 8, 64, 128
# Decode steps route 8 x top-4 tokens: computing every expert beats padding sorted blocks.
DECODE = {"moe_dispatch": "dense"}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large float32 array copy (read + write counted), median of `repeats`."""
    x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    copy = jax.jit(lambda a: a * 1.0000001)  # a real pass over memory, not an alias
    copy(x).block_until_ready()
    times = [_timed(lambda: copy(x).block_until_ready()) for _ in range(repeats)]
    return 2 * x.nbytes / statistics.median(times)


def _state_bytes(tree) -> int:
    return sum(a.nbytes for a in jax.tree.leaves(tree) if hasattr(a, "nbytes"))


def hf_generate(hf, prompts: np.ndarray):
    ids = torch.from_numpy(prompts.astype(np.int64))

    def run():
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        return out[:, PROMPT:].numpy()

    return run


def ours_generate(sampler: Sampler, prompts: np.ndarray):
    rows = prompts.tolist()

    def run():
        return sampler(rows, max_new_tokens=NEW, sampling=GREEDY).tokens[:, :NEW]

    return run


def _head(model, args) -> tuple[MTPHead, str]:
    """The draft head (random; see the module docstring)."""
    head = MTPHead(model.config, rngs=nnx.Rngs(1))
    return head, "random, not adapted (acceptance near 0: this shows the drafting overhead)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--draft_tokens", type=int, default=3)
    parser.add_argument("--skip_speculative", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    load_before = os.getloadavg()
    hf = transformers.AutoModelForCausalLM.from_config(hf_config()).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        config, model = load_hf(tmp, dtype="float32", moe_dispatch="sorted", scan_unroll=LAYERS)
    prompts = np.random.default_rng(0).integers(1, config.vocab_size, (BATCH, PROMPT))

    sampler = Sampler(model, decode_overrides=DECODE)
    runs = {"ours": ours_generate(sampler, prompts), "transformers": hf_generate(hf, prompts)}
    compile_s = _timed(runs["ours"])
    times = {name: [] for name in runs}
    outputs = {}
    for _ in range(args.repeats):  # interleaved: both see the same machine load
        for name, fn in runs.items():
            start = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - start)
    same = np.mean(outputs["ours"] == outputs["transformers"])
    med = {name: statistics.median(t) for name, t in times.items()}
    tps = {name: BATCH * NEW / t for name, t in med.items()}
    per_step = med["ours"] / NEW  # prefill included: an upper bound on one decode step
    bandwidth = memory_bandwidth()
    weights = _state_bytes(nnx.state(model))
    cache = _state_bytes(model.init_cache(BATCH, PROMPT + NEW))
    floor = (weights + cache) / bandwidth
    impl = hf.config._experts_implementation, hf.config._attn_implementation

    print(f"config: qwen3_5_moe_text hidden {HIDDEN}, {LAYERS} layers, "
          f"{config.num_experts} experts top-{config.num_experts_per_tok}, vocab "
          f"{config.vocab_size}; batch {BATCH}, prompt {PROMPT}, {NEW} new tokens, greedy, "
          f"float32, CPU ({os.cpu_count()} cores); transformers experts={impl[0]} "
          f"attention={impl[1]}; ours: prefill MoE sorted, decode MoE {DECODE['moe_dispatch']}")  # fmt: skip
    print(f"load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}; "
          f"medians of {args.repeats} interleaved calls; tokens equal to transformers': "
          f"{same:.1%}")  # fmt: skip
    print(f"ours (Sampler, while_loop): {tps['ours']:8.1f} tokens/s  ({med['ours']:.2f} s/call, "
          f"first call incl. compile {compile_s:.1f} s)")  # fmt: skip
    print(f"transformers generate:      {tps['transformers']:8.1f} tokens/s  "
          f"({med['transformers']:.2f} s/call)")  # fmt: skip
    print(f"speed-up ours vs transformers: {tps['ours'] / tps['transformers']:.2f}x "
          "(target >= 3x)")  # fmt: skip
    print(f"memory bandwidth (array copy): {bandwidth / 1e9:.1f} GB/s; one step reads "
          f"{weights / 2**20:.1f} MiB of weights + {cache / 2**20:.1f} MiB of cache -> floor "
          f"{floor * 1e3:.2f} ms/step")  # fmt: skip
    print(f"our step (call time / {NEW}, prefill included): {per_step * 1e3:.2f} ms = "
          f"{per_step / floor:.1f}x the bandwidth floor")  # fmt: skip
    if not args.skip_speculative:
        speculative(model, sampler, prompts, args)


def speculative(model, plain: Sampler, prompts: np.ndarray, args) -> None:
    """Plain vs speculative decoding tokens/s (one timed call each, after compiling)."""
    head, origin = _head(model, args)
    samplers = {
        "plain": plain,
        "speculative": Sampler(
            model, mtp=head, num_draft_tokens=args.draft_tokens, decode_overrides=DECODE
        ),
    }
    rows = prompts.tolist()
    outputs = {  # compiles the speculative program (the plain one exists)
        name: s(rows, max_new_tokens=NEW, sampling=GREEDY) for name, s in samplers.items()
    }
    same = np.array_equal(outputs["plain"].tokens, outputs["speculative"].tokens)
    tps = {
        name: BATCH * NEW / _timed(lambda s=s: s(rows, max_new_tokens=NEW, sampling=GREEDY))
        for name, s in samplers.items()
    }
    accept = outputs["speculative"].acceptance_length
    print(f"MTP head: {origin}; k = {args.draft_tokens} drafts, acceptance length "
          f"{accept:.2f} tokens/verification")  # fmt: skip
    print(f"plain {tps['plain']:.1f} tokens/s, speculative {tps['speculative']:.1f} tokens/s: "
          f"{tps['speculative'] / tps['plain']:.2f}x; identical greedy tokens: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
