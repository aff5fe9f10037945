"""Chat-format throughput: `render` / `render_tokens` against `apply_chat_template`.

The peer is what a data pipeline would otherwise call: the same template through
`tokenizer.apply_chat_template` (Jinja), as text and as token ids. `render_tokens` does more
work than its peer (it also computes the loss mask), so a ratio above 1 means the Python
renderer pays for the mask and still wins. Conversations are agent episodes in the bundled
world's shape: the tool schemas in the system turn, two to four tool rounds, mixed English and
Chinese. Run: `python -m bench.bench_chat_format` (or `make bench`).
"""

from __future__ import annotations

import json
import statistics
import time

from data.tokenizer import DEFAULT_WORLD, load_tokenizer
from hat_jax.chat_format import parse, render, render_completion, render_tokens

_FALLBACK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "A bundled-world tool. 直播间工具。" * 3,
            "parameters": {
                "type": "object",
                "properties": {"product_id": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["product_id"],
            },
        },
    }
    for i in range(12)
]


def _tools():
    path = DEFAULT_WORLD / "harness" / "tools.json"
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
        tools = tools.get("tools", tools) if isinstance(tools, dict) else tools
        schemas = [t if "function" in t else {"type": "function", "function": t} for t in tools]
        render([{"role": "user", "content": "q"}], schemas)
        return schemas, "bundled world"
    except (OSError, ValueError, TypeError, AttributeError):
        return _FALLBACK_TOOLS, "built-in stand-in"


def _episode(k: int, tools) -> list[dict]:
    name = tools[k % len(tools)]["function"]["name"]
    messages = [
        {
            "role": "system",
            "content": "你是直播间的数字人助理。Answer briefly and never invent prices.",
        },
        {"role": "user", "content": f"第{k}号口红还有货吗？Is item {k} in stock and any coupon?"},
    ]
    for r in range(2 + k % 3):
        messages.append(
            {
                "role": "assistant",
                "reasoning_content": f"Round {r}: I need to call {name} before answering. " * 3,
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": {"product_id": f"sku-{k}-{r}", "n": r, "tags": ["红", r]},
                        },
                    }
                ],
            }
        )
        result = {"ok": True, "stock": 10 * r + k, "note": "库存充足，满199减20"}
        messages.append({"role": "tool", "content": json.dumps(result, ensure_ascii=False)})
    messages.append(
        {
            "role": "assistant",
            "reasoning_content": "Answer.",
            "content": "有货的宝宝，还有优惠券哦！",
        }
    )
    return messages


def _time(fn, passes):
    """Median over passes of the mean seconds per item."""
    per_pass = []
    for items in passes:
        start = time.perf_counter()
        for item in items:
            fn(item)
        per_pass.append((time.perf_counter() - start) / len(items))
    return statistics.median(per_pass)


def main() -> None:
    tokenizer = load_tokenizer()
    tools, source = _tools()
    # Every episode is distinct (only the system turn is shared, as in a corpus), and each timed
    # pass gets new ones, so the segment cache of `render_tokens` helps only where it would.
    passes = [[_episode(1000 * p + k, tools) for k in range(48)] for p in range(5)]
    episodes = [e for batch in passes for e in batch]
    sample = passes[0][:8]
    for e in sample:  # same text and ids, so the comparison is like for like
        assert tokenizer.apply_chat_template(e, tools=tools, tokenize=False) == render(e, tools)
        ids = tokenizer.apply_chat_template(e, tools=tools)["input_ids"]
        assert render_tokens(e, tokenizer, tools).ids == ids
    n_tokens = sum(len(render_tokens(e, tokenizer, tools).ids) for e in sample) / len(sample)
    fresh = [[_episode(10**6 + 1000 * p + k, tools) for k in range(48)] for p in range(5)]

    rows = [
        (
            "text",
            _time(lambda e: render(e, tools), passes),
            _time(lambda e: tokenizer.apply_chat_template(e, tools=tools, tokenize=False), passes),
        ),
        (
            "token ids (+ loss mask)",
            _time(lambda e: render_tokens(e, tokenizer, tools), fresh),
            _time(lambda e: tokenizer.apply_chat_template(e, tools=tools)["input_ids"], fresh),
        ),
    ]
    print(f"tokenizer: demo ({len(tokenizer)} tokens); tools: {len(tools)} from {source}")
    print(f"episodes: {len(episodes)} distinct per row, about {n_tokens:.0f} tokens each")
    print(
        f"{'output':<26}{'ours µs':>10}{'apply_chat_template µs':>25}{'speed-up':>10}{'tokens/s':>12}"
    )
    for name, ours, peer in rows:
        print(
            f"{name:<26}{ours * 1e6:>10.0f}{peer * 1e6:>25.0f}{peer / ours:>9.1f}x"
            f"{n_tokens / ours:>12.0f}"
        )

    completions = [
        [render_completion(m) for e in b for m in e if m["role"] == "assistant"] for b in passes
    ]
    per_turn = _time(lambda t: parse(t, tools), completions)
    print(f"parse: {per_turn * 1e6:.0f} µs per assistant turn")


if __name__ == "__main__":
    main()
