"""`serve._engine.SlotEngine` (continuous batching) and `serve._chat_api.DeltaStream`.

- Tokens reach a request's listener while it decodes, one call per token, before its future
  resolves; a request that arrives mid-decode is admitted at the next step and a short one
  leaves before a long one that started earlier.
- Completions equal `SlotDecoder.generate`'s for the same seeds; a bad request fails alone;
  a cancelled request frees its slot; closing fails what is left.
- `DeltaStream`: on generated texts (tags, tool calls, stop strings, end-of-turn tokens, with
  and without thinking, cut at arbitrary points), the streamed deltas reassemble exactly to
  the parsed message.
"""

import concurrent.futures
import random
import threading

import pytest
from flax import nnx

import models
from serve import _chat_api as api
from serve._engine import EngineClosedError, SlotEngine


def _model() -> models.Qwen:
    config = models.QwenConfig.preset("qwen3_30b_a3b").replace(
        vocab_size=128, hidden_size=32, num_layers=1, layer_types=("full_attention",),
        num_heads=2, num_kv_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, max_position_embeddings=256, dtype="float32",
        param_dtype="float32", remat="none", moe_dispatch="dense",
    )  # fmt: skip
    return models.Qwen(config, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture
def engine(model):
    decoder = models.SlotDecoder(model, slots=2, max_length=128)
    engine = SlotEngine(decoder, seed=0)
    yield engine
    engine.close()


def test_tokens_stream_before_the_request_completes(engine):
    seen, done_when_seen = [], []
    future = None
    ready = threading.Event()

    def listen(row, tokens):
        ready.wait()
        seen.extend(tokens)
        done_when_seen.append(future.done())

    future = engine.submit([[5, 6, 7]], max_new_tokens=12, sampling=models.GREEDY,
                           on_tokens=listen)  # fmt: skip
    ready.set()
    (completion,) = future.result(60)
    assert seen == list(completion.token_ids) and len(seen) == 12
    assert not any(done_when_seen)  # every token was heard before the answer was complete


def test_a_late_short_request_leaves_before_an_early_long_one(engine):
    third = threading.Event()
    heard = []

    def listen(row, tokens):
        heard.extend(tokens)
        if len(heard) >= 3:
            third.set()

    long = engine.submit([[1, 2, 3, 4]], max_new_tokens=60, sampling=models.GREEDY,
                         on_tokens=listen)  # fmt: skip
    assert third.wait(60)
    short = engine.submit([[9, 9]], max_new_tokens=2, sampling=models.GREEDY)
    short.result(60)
    assert not long.done()  # the short request did not wait for the long one
    assert len(long.result(60)[0].token_ids) == 60


def test_completions_equal_the_decoder_and_seeds_hold(model, engine):
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]]
    hot = models.Sampling(temperature=1.2)
    futures = [engine.submit([p], max_new_tokens=8, sampling=hot, seed=40 + i)
               for i, p in enumerate(prompts)]  # fmt: skip
    got = [f.result(60)[0].token_ids for f in futures]
    reference = models.SlotDecoder(model, slots=1, max_length=128).generate(
        prompts, max_new_tokens=8, sampling=hot, seeds=[40, 41, 42]
    )
    assert [list(g) for g in got] == reference
    # n rows of one seeded request differ from each other and repeat across calls.
    rows = engine.submit([prompts[0]] * 3, max_new_tokens=8, sampling=hot, seed=7).result(60)
    again = engine.submit([prompts[0]] * 3, max_new_tokens=8, sampling=hot, seed=7).result(60)
    assert rows == again and len({r.token_ids for r in rows}) == 3


def test_a_bad_request_fails_alone_and_cancel_frees_a_slot(engine):
    bad = engine.submit([[1] * 100], max_new_tokens=50, sampling=models.GREEDY)
    with pytest.raises(ValueError, match="max_length=128"):
        bad.result(60)
    long = engine.submit([[1, 2]], max_new_tokens=120, sampling=models.GREEDY)
    other = engine.submit([[1, 2]], max_new_tokens=120, sampling=models.GREEDY)
    engine.cancel(long)
    engine.cancel(other)
    for f in (long, other):
        with pytest.raises(concurrent.futures.CancelledError):
            f.result(60)
    assert engine.submit([[4]], max_new_tokens=3, sampling=models.GREEDY).result(60)
    assert not engine.decoder.active.any()


def test_close_fails_what_is_left(model):
    engine = SlotEngine(models.SlotDecoder(model, slots=1, max_length=128))
    running = engine.submit([[1, 2]], max_new_tokens=120, sampling=models.GREEDY)
    queued = engine.submit([[3]], max_new_tokens=120, sampling=models.GREEDY)
    engine.close()
    for f in (running, queued):
        with pytest.raises(EngineClosedError):
            f.result(60)
    with pytest.raises(EngineClosedError):
        engine.submit([[1]], max_new_tokens=1, sampling=models.GREEDY)


TOOLS = [{"type": "function", "function": {"name": "get_price", "description": "d",
          "parameters": {"type": "object", "properties": {"sku": {"type": "string"}}}}}]  # fmt: skip
PIECES = [
    "Load",
    " product-qa",
    ";",
    " the",
    " mug",
    " is",
    " 19",
    "\n",
    "\n\n",
    " ",
    "<think>",
    "</think>",
    "<tool_call>",
    "\n<function=get_price>\n<parameter=sku>\nA1\n</parameter>\n</function>\n</tool_call>",
    "<|im_end|>",
    "STOP",
    "<b>",
    "x<",
    "中文",
    "END",
]


def _joined(deltas):
    out = {"reasoning_content": "", "content": "", "tool_calls": []}
    for d in deltas:
        for key in ("reasoning_content", "content"):
            out[key] += d.get(key) or ""
        out["tool_calls"] += d.get("tool_calls", [])
    return out


def test_streamed_deltas_reassemble_to_the_parsed_message():
    checked = streamed = 0
    for trial in range(1500):
        rnd = random.Random(trial)
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 25)))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        if rnd.random() < 0.5:
            body["tools"] = TOOLS
        if rnd.random() < 0.3:
            body["stop"] = ["STOP"]
        if rnd.random() < 0.3:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        if rnd.random() < 0.2:
            body["separate_reasoning"] = False
        chat = api.ChatRequest.parse(body)
        if not chat.enable_thinking and "</think>" in text:
            continue  # documented: a late </think> turns streamed content into reasoning
        stream = api.DeltaStream(chat)
        deltas, end = stream.start(), 0
        while end < len(text):
            end = min(len(text), end + rnd.randint(1, 6))
            deltas += stream.update(text[:end])
        live = len(deltas) - 1
        choice = api.choice_for(text, stopped="<|im_end|>" in text, tokens=1, request=chat,
                                call_id="call_x")  # fmt: skip
        deltas += stream.finish(choice)
        assert stream.consistent, text
        assert _joined(deltas) == _joined(api.stream_deltas(choice, chat)), text
        checked += 1
        streamed += live > 0
    assert checked > 1000 and streamed > 300  # most texts sent something before the end


def test_a_failing_listener_fails_its_request_only(engine):
    def broken(row, tokens):
        raise RuntimeError("the stream is gone")

    bad = engine.submit([[1, 2]], max_new_tokens=30, sampling=models.GREEDY, on_tokens=broken)
    with pytest.raises(RuntimeError, match="the stream is gone"):
        bad.result(60)
    assert len(engine.submit([[3]], max_new_tokens=5, sampling=models.GREEDY).result(60)[0]
               .token_ids) == 5  # fmt: skip
    assert not engine.decoder.active.any()


def test_warmup_compiles_what_such_requests_need(model):
    engine = SlotEngine(models.SlotDecoder(model, slots=4, max_length=128, steps_per_call=4))
    compiled = engine.warmup([6], max_new_tokens=20)
    assert compiled == engine.decoder.compilations["admit"] + engine.decoder.compilations["step"]
    before = engine.decoder.compilations
    futures = [engine.submit([[i + 1] * 6], max_new_tokens=20, sampling=models.Sampling())
               for i in range(4)]  # fmt: skip
    assert all(len(f.result(60)[0].token_ids) == 20 for f in futures)
    assert engine.decoder.compilations == before  # nothing compiled while serving
    engine.close()
