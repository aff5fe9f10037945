"""The local server: time to first token and throughput, slot engine vs batch engine.

`serve.server` over HTTP (uvicorn, the real routes), streaming chat requests sent by 1, 4 and
8 concurrent clients (each sends its next request when its answer has arrived), served once
by the `BatchEngine` (whole batches in one compiled call: a stream is sent when its answer is
complete) and once by the `SlotEngine` (continuous batching: requests join and leave between
decode steps, text is streamed as it is decoded). Per engine and concurrency: generated
tokens per second of wall time, time to first token (TTFT: the first chunk that carries
generated text or a tool call) p50/p95, latency p50, and TTFT / latency. Every request
samples (temperature 1) up to a fixed number of tokens (a random model rarely stops early;
the token counts say so). Each engine is warmed up first. Medians over repeats.

    python -m bench server                    # a random mid-size policy exported as HF
    python -m bench.bench_server --checkpoint runs/demo/export/hf [--requests 32] [--max_tokens 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
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
    """(wall seconds, generated tokens, [(ttft, latency)]) of `requests` streamed chat
    requests sent by `concurrency` clients (one connection each)."""
    counter = iter(range(requests))
    lock = threading.Lock()
    timings: list[tuple[float, float]] = []

    def client() -> int:
        tokens = 0
        with httpx.Client(base_url=url, timeout=600) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return tokens
                body = {"model": model, "messages": _messages(i), "temperature": 1.0,
                        "max_tokens": max_tokens, "stream": True,
                        "stream_options": {"include_usage": True}}  # fmt: skip
                sent, first = time.perf_counter(), None
                with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                    reply.raise_for_status()
                    for line in reply.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            tokens += chunk["usage"]["completion_tokens"]
                        for choice in chunk["choices"]:
                            delta = choice["delta"]
                            if first is None and any(
                                delta.get(k) for k in ("reasoning_content", "content", "tool_calls")
                            ):
                                first = time.perf_counter()
                done = time.perf_counter()
                with lock:
                    timings.append(((first or done) - sent, done - sent))

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(lambda _: client(), range(concurrency)))
    return time.perf_counter() - start, tokens, timings


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="HF or Orbax dir (default: random)")
    parser.add_argument("--size", choices=["bench", "tiny"], default="bench",
                        help="the random policy without --checkpoint")  # fmt: skip
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    levels = (1, 4, 8)
    results: dict[tuple[str, int], list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or _random_export(tmp, args.size)
        for engine in ("batch", "slots"):
            served = load_served_model(checkpoint, max_length=1024, engine=engine,
                                       max_batch_rows=8)  # fmt: skip
            with serve_in_background(create_app(served)) as url:
                prompt = served.tokenizer.encode(_render(0), add_special_tokens=False)
                served.engine.warmup([len(prompt)], args.max_tokens, models.Sampling())
                for _ in range(args.repeats):
                    for c in levels:
                        results.setdefault((engine, c), []).append(
                            _run(url, served.name, args.requests, c, args.max_tokens)
                        )
    print(f"checkpoint: {checkpoint if args.checkpoint else f'{args.size} random, as HF'}")
    print(f"{args.requests} streamed requests x up to {args.max_tokens} tokens, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'engine':>7} {'clients':>7} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p95':>9} "
          f"{'latency p50':>11} {'TTFT/lat':>8}")  # fmt: skip
    rates = {}
    for (engine, c), runs in results.items():
        rate = statistics.median(tokens / seconds for seconds, tokens, _ in runs)
        timings = [t for _, _, ts in runs for t in ts]
        ttft = [t[0] for t in timings]
        latency = [t[1] for t in timings]
        ratio = statistics.median(a / b for a, b in timings)
        rates[engine, c] = rate
        print(f"{engine:>7} {c:>7} {rate:>9.1f} {_percentile(ttft, 0.5) * 1e3:>7.0f}ms "
              f"{_percentile(ttft, 0.95) * 1e3:>7.0f}ms {_percentile(latency, 0.5) * 1e3:>9.0f}ms "
              f"{ratio:>8.2f}")  # fmt: skip
    for c in levels:
        print(f"throughput slots / batch at {c} clients: "
              f"{rates['slots', c] / rates['batch', c]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
