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

Speculative vs plain decoding (greedy, k = 3 drafts, batch 8, up to 128 tokens) uses the
head the MTP adaptation stage adapted (`python -m launch.mtp --config=configs/mtp_demo.py`
exports policy + head to `runs/demo/mtp/hf`; `--mtp_dir`) on that stage's tiny demo policy
and held-out instruction prompts. Without that directory it falls back to a random head on
the mid-size model, and says so: greedy, a random head's drafts are almost never accepted,
so that shows only the drafting overhead (and that greedy tokens do not change); at
temperature 1 a random model's and head's distributions are both near uniform, so drafts
pass often: neither figure is a learned policy's. `--corpus DIR`
prompts the pair with the agent's own traffic instead: the first agent turns of that teacher
corpus's dev split (Harness system prompt, tools and the viewer's comment), as the MTP stage's
`data.source = "corpus"` does; an agent policy's head is measured on what it serves.

    python -m bench decode     # or: python -m bench.bench_decode [--repeats 3] [--skip_speculative]
    python -m bench.bench_decode --skip_plain --mtp_dir runs/demo/mtp/hf --corpus runs/demo/corpus
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

import data
from bench.bench_model import HIDDEN, LAYERS, hf_config
from data.tokenizer import load_tokenizer
from hat_jax import chat_format
from models import GREEDY, MTPHead, Sampler, Sampling
from serve import load_hf, load_mtp

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--draft_tokens", type=int, default=3)
    parser.add_argument("--skip_speculative", action="store_true")
    parser.add_argument(
        "--skip_plain", action="store_true", help="only the speculative vs plain comparison"
    )
    parser.add_argument(
        "--corpus",
        default="",
        help="a teacher corpus: prompt the adapted pair with its dev split's agent turns",
    )
    parser.add_argument("--max_prompt_len", type=int, default=4096, help="with --corpus")
    parser.add_argument(
        "--mtp_dir",
        default="runs/demo/mtp/hf",
        help="HF export of the MTP stage (policy + adapted head); a random head if missing",
    )
    args = parser.parse_args()
    if args.skip_plain:
        speculative(None, None, None, args)
        return
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


def adapted_pair(directory: pathlib.Path, corpus: str = "", max_prompt_len: int = 4096):
    """The MTP stage's exported policy + adapted head, and prompts: held-out instructions, or
    the first agent turns of `corpus`'s dev split."""
    config, model = load_hf(directory, dtype="float32", moe_dispatch="sorted")
    head = load_mtp(directory, config=config, dtype="float32")
    tokenizer = load_tokenizer(directory)
    if corpus:
        prompts = corpus_prompts(corpus, tokenizer, directory, max_prompt_len)
    else:
        held_out = data.load_instructions()[-BATCH:]  # the stage holds out the last ones
        prompts = [
            tokenizer.encode(
                chat_format.render(list(i.messages), add_generation_prompt=True),
                add_special_tokens=False,
            )
            for i in held_out
        ]
    return model, head, prompts, [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def corpus_prompts(corpus: str, tokenizer, tokenizer_dir, max_prompt_len: int) -> list[list[int]]:
    """`BATCH` prompts: the first agent turns of `corpus`'s dev split, in order."""
    from rl import prompts_from_rows

    if not (pathlib.Path(corpus) / "dev.manifest.json").is_file():
        raise FileNotFoundError(f"--corpus {corpus}: no dev split (dev.manifest.json)")
    config = data.PipelineConfig(sources=(corpus,), split="dev", seq_len=max_prompt_len + 512,
                                 global_batch_size=1, shuffle=False, num_epochs=1,
                                 tokenizer_dir=str(tokenizer_dir))  # fmt: skip
    rows = data.sft_data(config, tokenizer=tokenizer, process_index=0, process_count=1)
    cut = prompts_from_rows(rows, batch_size=BATCH, max_prompt_len=max_prompt_len,
                            pad_id=data.pad_id(tokenizer))  # fmt: skip
    batch = next(cut, None)
    if batch is None:
        raise ValueError(f"--corpus {corpus}: fewer than {BATCH} agent prompts of <= "
                         f"{max_prompt_len} tokens in its dev split")  # fmt: skip
    return [row[:n].tolist() for row, n in zip(batch["prompt_ids"], batch["prompt_lengths"])]


def speculative(model, plain: Sampler, prompts: np.ndarray, args) -> None:
    """Plain vs speculative decoding tokens/s (greedy and temperature 1, after compiling): the
    adapted head of `--mtp_dir` on its policy when that directory exists, else a random
    head on the benchmark's model."""
    directory = pathlib.Path(args.mtp_dir)
    if (directory / "config.json").is_file():
        model, head, rows, stops = adapted_pair(directory, args.corpus, args.max_prompt_len)
        plain = Sampler(model, decode_overrides=DECODE)
        what = (
            f"agent turns of {args.corpus}'s dev split" if args.corpus else "held-out instructions"
        )
        origin = f"adapted by the MTP stage ({directory}: its policy; {what})"
    elif args.skip_plain or args.corpus:
        raise FileNotFoundError(f"--mtp_dir {directory}: no MTP stage export (config.json)")
    else:
        head, rows, stops = MTPHead(model.config, rngs=nnx.Rngs(1)), prompts.tolist(), []
        origin = (
            f"random, not adapted ({directory} not found; on random weights greedy drafts "
            "almost never pass and sampled ones often do: not a learned policy's figure)"
        )
    samplers = {
        "plain": plain,
        "speculative": Sampler(
            model, mtp=head, num_draft_tokens=args.draft_tokens, decode_overrides=DECODE
        ),
    }

    def call(s):
        return s(rows, max_new_tokens=NEW, sampling=GREEDY, stop_tokens=stops)

    outputs = {name: call(s) for name, s in samplers.items()}  # compiles
    same = np.array_equal(outputs["plain"].tokens, outputs["speculative"].tokens)
    accept = outputs["speculative"].acceptance_length
    print(f"MTP head: {origin}; k = {args.draft_tokens} drafts; medians of 3 interleaved calls")
    for label, sampling in (("greedy", GREEDY), ("temperature 1", Sampling(temperature=1.0))):
        rates = {name: [] for name in samplers}
        for seed in range(3):  # tokens differ per seed when sampling: each call counts its own
            for name, s in samplers.items():
                start = time.perf_counter()
                out = s(rows, max_new_tokens=NEW, sampling=sampling, stop_tokens=stops, seed=seed)
                rates[name].append(int(out.lengths.sum()) / (time.perf_counter() - start))
                if name == "speculative":
                    accept = out.acceptance_length
        tps = {name: statistics.median(r) for name, r in rates.items()}
        print(f"{label}: plain {tps['plain']:.1f} tokens/s, speculative "
              f"{tps['speculative']:.1f} tokens/s = {tps['speculative'] / tps['plain']:.2f}x; "
              f"acceptance length {accept:.2f}"
              + (f"; identical tokens: {same}" if sampling.greedy else ""))  # fmt: skip


if __name__ == "__main__":
    main()
