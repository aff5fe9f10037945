"""The local server's throughput: concurrent clients decoded together vs one at a time.

`serve.server` over HTTP (uvicorn, the real routes), the same requests at concurrency 1
(each request waits for the previous one) and at concurrency 8 (eight client threads): the
figure is generated tokens per second of wall time, and the ratio says what batching
concurrent requests buys. Every request samples (temperature 1) a fixed number of tokens
(the stop token is not in the prompt's reach of a random model; with a trained checkpoint
rows may stop early and the token counts say so). The engine is warmed up first
(`BatchEngine.warmup`: one program per batch size). Peers are interleaved, medians printed.

    python -m bench server                    # a random mid-size policy exported as HF
    python -m bench.bench_server --checkpoint runs/demo/export/hf [--requests 64] [--max_tokens 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import tempfile
import threading
import time

import httpx
from flax import nnx

import models
from data.tokenizer import DEFAULT_DIR, load_tokenizer
from hat_jax import chat_format
from serve import convert
from serve.server import create_app, load_served_model, serve_in_background


def _random_export(directory: str, size: str) -> str:
    """A random policy exported as HF with the demo tokenizer: the `tiny` preset, or the
    mid-size config of `bench_model` (8 layers, hidden 256, 32 experts, top-4)."""
    tokenizer = load_tokenizer()
    if size == "tiny":
        config = models.QwenConfig.preset("tiny", vocab_size=len(tokenizer))
    else:
        from bench.bench_model import hf_config

        config = models.QwenConfig.from_hf(hf_config().to_dict())
    config = config.replace(max_position_embeddings=2048)
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    out = os.path.join(directory, f"{size}-policy")
    convert.save_hf(model, config, out, tokenizer_dir=str(DEFAULT_DIR), dtype="float32")
    return out


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Viewer {i:02d}: is the blue mug in stock?"}]


def _render(i: int) -> str:
    return chat_format.render(_messages(i), add_generation_prompt=True)


def _run(url: str, model: str, requests: int, concurrency: int, max_tokens: int):
    """(seconds, generated tokens) of `requests` chat requests sent by `concurrency` clients,
    each sending its next request when its answer arrives (one connection per client)."""
    counter = iter(range(requests))
    lock = threading.Lock()

    def client() -> int:
        tokens = 0
        with httpx.Client(base_url=url, timeout=600) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return tokens
                body = {"model": model, "messages": _messages(i), "temperature": 1.0,
                        "max_tokens": max_tokens}  # fmt: skip
                reply = http.post("/v1/chat/completions", json=body)
                reply.raise_for_status()
                tokens += reply.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(lambda _: client(), range(concurrency)))
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="HF or Orbax dir (default: random)")
    parser.add_argument("--size", choices=["bench", "tiny"], default="bench",
                        help="the random policy without --checkpoint")  # fmt: skip
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or _random_export(tmp, args.size)
        served = load_served_model(checkpoint, max_length=1024)
        with serve_in_background(create_app(served)) as url:
            prompt = served.tokenizer.encode(_render(0), add_special_tokens=False)
            served.engine.warmup([len(prompt)], args.max_tokens, models.Sampling())
            figures = {1: [], 8: []}
            for _ in range(args.repeats):
                for c in (1, 8):
                    seconds, tokens = _run(url, served.name, args.requests, c, args.max_tokens)
                    figures[c].append((tokens / seconds, seconds, tokens))
            stats = served.engine.stats.as_dict()
    print(f"checkpoint: {checkpoint if args.checkpoint else f'{args.size} random, as HF'}")
    print(
        f"{args.requests} requests x {args.max_tokens} tokens, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'concurrency':>12} {'tokens/s':>10} {'seconds':>9} {'tokens':>7}")
    medians = {}
    for c, rows in figures.items():
        rate = statistics.median(r[0] for r in rows)
        medians[c] = rate
        seconds = statistics.median(r[1] for r in rows)
        print(f"{c:>12} {rate:>10.1f} {seconds:>9.2f} {rows[0][2]:>7}")
    print(f"throughput ratio (concurrency 8 / 1): {medians[8] / medians[1]:.2f}x")
    print(f"engine: {stats['batches']} batches, {stats['mean_batch_rows']:.2f} rows per batch")


if __name__ == "__main__":
    main()
