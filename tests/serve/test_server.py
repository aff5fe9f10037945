"""`serve.server`: the OpenAI-compatible server, over HTTP with uvicorn.

Two servers:
- a tiny random Qwen3.5 exported as an HF directory and loaded the way `python -m
  serve.server --checkpoint DIR` loads it (slow tests: the sampler compiles per shape):
  greedy answers equal `models.Sampler`'s, streams reassemble to the plain answer, the
  official `openai` client works, concurrent requests are decoded together, a seeded request
  gives the same sample whatever is decoded beside it;
- a scripted sampler that writes fixed text (reasoning and a Qwen XML tool call), for the
  wire format, the clients and bad requests.
"""

import concurrent.futures
import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from flax import nnx

import models
from data.tokenizer import DEFAULT_DIR, load_tokenizer
from hat_jax import chat_format, llm_client
from hat_jax import harness as hx
from serve import _chat_api, convert
from serve._engine import BatchEngine, SlotEngine
from serve.server import ServedModel, create_app, load_served_model, serve_in_background

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_price",
            "description": "Price of a product.",
            "parameters": {
                "type": "object",
                "properties": {"product": {"type": "string"}, "units": {"type": "integer"}},
                "required": ["product"],
            },
        },
    }
]
QUESTION = [
    {"role": "system", "content": "You sell things in a live room."},
    {"role": "user", "content": "How much is the mug?"},
]
SCRIPT = (
    "The viewer asks a price.\n</think>\n\n<tool_call>\n<function=lookup_price>\n"
    "<parameter=product>\nmug\n</parameter>\n<parameter=units>\n2\n</parameter>\n"
    "</function>\n</tool_call><|im_end|>"
)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


class ScriptedSampler:
    """Writes `text` (cut to each row's limit) for every prompt, like a `models.Sampler`."""

    num_draft_tokens = 0

    def __init__(self, tokenizer, text: str, max_length: int = 512):
        self.ids = tokenizer.encode(text, add_special_tokens=False)
        self.max_length, self.calls = max_length, []

    def __call__(self, prompts, *, max_new_tokens, sampling, stop_tokens, seed, shared_prefix):
        self.calls.append(len(prompts))
        rows = [self.ids[:n] for n in max_new_tokens]
        width = max(len(r) for r in rows)
        tokens = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
        lengths = np.array([len(r) for r in rows], np.int32)
        zeros = np.zeros(tokens.shape, np.float32)
        stopped = np.array([r[-1] in stop_tokens for r in rows])
        return models.SampleOutput(tuple(prompts), tokens, lengths, zeros, zeros, stopped, 0)


@pytest.fixture(scope="module")
def scripted(tokenizer):
    """(base URL, sampler) of a server whose model writes `SCRIPT`."""
    sampler = ScriptedSampler(tokenizer, SCRIPT)
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    served = ServedModel("scripted", tokenizer, BatchEngine(sampler, stops))
    with serve_in_background(create_app(served)) as url:
        yield url, sampler


def test_tool_call_and_reasoning_come_back_structured(scripted):
    url, _ = scripted
    body = {"model": "scripted", "messages": QUESTION, "tools": TOOLS, "max_tokens": 200}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "The viewer asks a price."
    assert message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "lookup_price"
    # Arguments are a JSON string, typed by the tool's schema (units is an integer).
    assert json.loads(call["function"]["arguments"]) == {"product": "mug", "units": 2}
    assert reply["usage"]["completion_tokens"] > 10


def test_without_tools_or_with_tool_choice_none_the_call_stays_text(scripted):
    url, _ = scripted
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        body = {"model": "scripted", "messages": QUESTION, **extra}
        message = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()
        message = message["choices"][0]["message"]
        assert "tool_calls" not in message
        assert message["content"].startswith("<tool_call>\n<function=lookup_price>")


def test_cut_call_is_returned_as_text_with_finish_reason_length(scripted, tokenizer):
    url, _ = scripted
    cut = len(tokenizer.encode(SCRIPT.split("</function>")[0], add_special_tokens=False))
    body = {"model": "scripted", "messages": QUESTION, "tools": TOOLS, "max_tokens": cut}
    choice = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    assert "<parameter=product>" in choice["message"]["content"]


def test_stop_strings_cut_the_text(scripted):
    url, _ = scripted
    body = {"model": "scripted", "messages": QUESTION, "stop": ["zzz", "price"]}
    choice = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning_content"] == "The viewer asks a"
    assert choice["message"]["content"] == ""
    body = {"model": "scripted", "messages": QUESTION, "separate_reasoning": False}
    message = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()
    content = message["choices"][0]["message"]["content"]
    assert content.startswith("<think>\nThe viewer asks a price.\n</think>\n\n<tool_call>")


def test_openai_compat_policy_and_official_client_work_unchanged(scripted):
    url, _ = scripted
    policy = hx.OpenAICompatPolicy(base_url=f"{url}/v1", model="scripted", server_extensions=True)
    turn = policy.generate(QUESTION, TOOLS, hx.SamplingParams(max_tokens=200, seed=1))
    assert turn.parse_errors == ()
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("lookup_price", {"product": "mug", "units": 2})
    ]
    assert turn.reasoning == "The viewer asks a price."

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["scripted"]
    reply = client.chat.completions.create(model="scripted", messages=QUESTION, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "lookup_price"
    assert json.loads(call.function.arguments) == {"product": "mug", "units": 2}
    assert reply.choices[0].message.reasoning_content == "The viewer asks a price."
    stream = client.chat.completions.create(
        model="scripted", messages=QUESTION, tools=TOOLS, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["lookup_price"]
    assert chunks[-1].usage.total_tokens == reply.usage.total_tokens
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="other", messages=QUESTION)

    # The judge and the HSA rewriter post through llm_client.complete: content comes back.
    payload = {"model": "scripted", "messages": QUESTION, "temperature": 0.0, "max_tokens": 256,
               "seed": 1}  # fmt: skip
    with httpx.Client() as http:
        answer = llm_client.complete(http, f"{url}/v1/chat/completions", payload)
    assert answer.startswith("<tool_call>")


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"model": "nope", "messages": QUESTION}, 404, "model"),
        ({"model": "scripted"}, 400, "messages"),
        ({"model": "scripted", "messages": [{"role": "robot", "content": "x"}]}, 400,
         "messages[0].role"),
        ({"model": "scripted", "messages": [{"role": "assistant", "content": "x"}]}, 400,
         "messages"),  # no user query
        ({"model": "scripted", "messages": QUESTION, "tools": [{"type": "function"}]}, 400,
         "tools[0]"),
        ({"model": "scripted", "messages": QUESTION, "temperature": "hot"}, 400, "temperature"),
        ({"model": "scripted", "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "scripted", "messages": QUESTION, "max_tokens": 10_000}, 400, "max_tokens"),
        ({"model": "scripted", "messages": QUESTION, "tool_choice": "required"}, 400,
         "tool_choice"),
        ({"model": "scripted", "messages": QUESTION, "logprobs": True}, 400, "logprobs"),
        ({"model": "scripted", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [
                {"id": "a", "function": {"name": "f", "arguments": "{not json"}}]},
        ]}, 400, "messages[1].tool_calls[0]"),
        ({"model": "scripted", "messages": [{"role": "user", "content": "word " * 2000}]}, 400,
         "messages"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(scripted, body, status, field):
    url, _ = scripted
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["message"] and error["type"]
    if "max_tokens" in body and body["max_tokens"] > 1 or "word" in str(body):
        assert error["code"] == "context_length_exceeded"
    ok = httpx.post(f"{url}/v1/chat/completions", json={"model": "scripted", "messages": QUESTION})
    assert ok.status_code == 200


def test_malformed_json_unknown_routes_and_health(scripted):
    url, _ = scripted
    reply = httpx.post(f"{url}/v1/chat/completions", content=b"{oops", timeout=30)
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
    reply = httpx.get(f"{url}/v1/embeddings", timeout=30)
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok"}


def test_models_and_server_info_report_the_checkpoint_digest(tokenizer):
    info = {"checkpoint_digest": "sha256:ab", "tokenizer_digest": "sha256:cd", "dtype": "x"}
    served = ServedModel("scripted", tokenizer, BatchEngine(ScriptedSampler(tokenizer, SCRIPT),
                                                            [0]), info=info)  # fmt: skip
    with serve_in_background(create_app(served)) as url:
        (entry,) = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        reported = httpx.get(f"{url}/get_server_info", timeout=30).json()
    assert entry["id"] == "scripted" and entry["checkpoint_digest"] == "sha256:ab"
    assert entry["tokenizer_digest"] == "sha256:cd" and "dtype" not in entry
    assert reported["checkpoint_digest"] == "sha256:ab" and reported["tokenizer_digest"]


def test_api_key_is_required_when_set(tokenizer):
    sampler = ScriptedSampler(tokenizer, SCRIPT)
    served = ServedModel("scripted", tokenizer, BatchEngine(sampler, [0]))
    with serve_in_background(create_app(served, api_key="s3cret")) as url:
        body = {"model": "scripted", "messages": QUESTION}
        assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
        good = httpx.post(f"{url}/v1/chat/completions", json=body,
                          headers={"Authorization": "Bearer s3cret"})  # fmt: skip
        assert good.status_code == 200
    assert not served.engine.alive  # shutting the app down closed the engine


def test_engine_error_fails_only_its_requests(tokenizer):
    class Failing(ScriptedSampler):
        def __call__(self, prompts, **kw):
            if len(prompts) == 2:
                raise ValueError("Sampler: row 1 is bad")
            return super().__call__(prompts, **kw)

    engine = BatchEngine(Failing(tokenizer, SCRIPT), [0], window_s=0)
    bad = engine.submit([[1], [2]], max_new_tokens=4, sampling=models.GREEDY)
    with pytest.raises(ValueError, match="row 1 is bad"):
        bad.result(10)
    good = engine.submit([[1]], max_new_tokens=4, sampling=models.GREEDY).result(10)
    assert len(good) == 1 and len(good[0].token_ids) == 4
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([[1]], max_new_tokens=4, sampling=models.GREEDY)


def test_batches_are_padded_to_powers_of_two_and_warmup_compiles_each_size(tokenizer):
    sampler = ScriptedSampler(tokenizer, SCRIPT)
    engine = BatchEngine(sampler, [0], max_rows=6, window_s=0)
    assert engine.warmup([5], max_new_tokens=4) == 4  # 1, 2, 4 and 8 rows (6 pad to 8)
    assert sampler.calls == [1, 2, 4, 8]
    rows = engine.submit([[1], [2], [3]], max_new_tokens=3, sampling=models.GREEDY).result(10)
    assert sampler.calls[-1] == 4 and len(rows) == 3  # the placeholder row is not returned
    assert engine.stats.rows == 1 + 2 + 4 + 8 + 3
    engine.close()


def test_chat_request_reads_the_wire_fields():
    request = _chat_api.ChatRequest.parse({
        "model": "m", "messages": [{"role": "developer", "content": "rules"},
                                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0, "top_p": 0.5, "top_k": -1, "max_completion_tokens": 7, "stop": "x",
        "seed": 3, "n": 2, "chat_template_kwargs": {"enable_thinking": False},
    })  # fmt: skip
    assert request.messages[0]["role"] == "system"
    assert request.sampling == models.Sampling(temperature=0.0, top_p=0.5, top_k=0)
    assert (request.max_tokens, request.stop, request.seed, request.n) == (7, ("x",), 3, 2)
    assert not request.enable_thinking and request.separate_reasoning
    assert _chat_api.render_prompt(request).endswith("<think>\n\n</think>\n\n")


# The tiny model.


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory):
    """(base URL, served model, HF directory) of a tiny random policy."""
    config = models.QwenConfig.preset(
        "tiny", vocab_size=len(tokenizer), max_position_embeddings=1024
    )
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    hf_dir = tmp_path_factory.mktemp("tiny") / "tiny-policy"
    convert.save_hf(model, config, hf_dir, tokenizer_dir=str(DEFAULT_DIR), dtype="float32")
    served = load_served_model(str(hf_dir), max_length=512)  # the default engine: slots
    assert isinstance(served.engine, SlotEngine)
    with serve_in_background(create_app(served)) as url:
        yield url, served, hf_dir


@pytest.fixture(scope="module")
def tiny_batch(tiny):
    """The same policy served by the whole-batch engine."""
    _, _, hf_dir = tiny
    served = load_served_model(str(hf_dir), max_length=512, batch_window_s=0.1, engine="batch")
    with serve_in_background(create_app(served)) as url:
        yield url, served, hf_dir


def _post(url, **body):
    reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny-policy", **body},
                       timeout=600)  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply


@pytest.mark.slow
def test_greedy_answer_equals_the_sampler_and_the_stream_reassembles(tiny, tokenizer):
    url, _, hf_dir = tiny
    reply = _post(url, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=16).json()

    _, model = convert.load_hf(hf_dir, dtype="float32")
    text = chat_format.render(QUESTION, TOOLS, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    out = models.Sampler(model, max_length=512)(
        [prompt], max_new_tokens=16, sampling=models.GREEDY, stop_tokens=stops
    )
    ids = out.completion(0)
    expected = chat_format.parse(tokenizer.decode(ids, skip_special_tokens=False), TOOLS)
    message = reply["choices"][0]["message"]
    assert (message["reasoning_content"] or "") == expected.reasoning
    assert reply["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                              "total_tokens": len(prompt) + len(ids)}  # fmt: skip

    stream = _post(url, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=16,
                   stream=True)  # fmt: skip
    events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == (
        message["reasoning_content"] or ""
    )
    assert "".join(d.get("content", "") for d in deltas) == (message["content"] or "")
    assert chunks[-1]["choices"][0]["finish_reason"] == reply["choices"][0]["finish_reason"]
    assert len({c["id"] for c in chunks}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("server", ["tiny", "tiny_batch"])
def test_concurrent_requests_are_decoded_together_and_seeds_reproduce(server, request):
    url, served, _ = request.getfixturevalue(server)
    seeded = dict(messages=QUESTION, temperature=1.0, max_tokens=16, seed=11)
    alone = _post(url, **seeded).json()["choices"][0]["message"]

    before = served.engine.stats.batches
    start = threading.Barrier(8)

    def one(i):
        start.wait()
        if i == 0:
            return _post(url, **seeded).json()
        question = [{"role": "user", "content": f"Question {i}: is the mug in stock?"}]
        return _post(url, messages=question, temperature=1.0, max_tokens=16).json()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(8)))
    assert all(r["choices"][0]["finish_reason"] in ("stop", "length") for r in replies)
    # A seeded request's sample does not depend on the others (the batch engine decodes it
    # on its own; the slot engine draws each row's tokens from its own seed).
    assert replies[0]["choices"][0]["message"] == alone
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    if isinstance(served.engine, BatchEngine):
        # The seven others shared batches: far fewer sampler calls than requests.
        assert served.engine.stats.batches - before <= 4
    else:
        # Rows were decoded side by side: far fewer decode steps than tokens.
        assert served.engine.stats.batches - before <= tokens / 3

    many = _post(url, messages=QUESTION, temperature=1.0, max_tokens=16, n=3, seed=5).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    info = httpx.get(f"{url}/get_server_info").json()
    assert info["rows"] >= 12 and info["mean_batch_rows"] > 1


@pytest.mark.slow
def test_the_server_reports_the_digest_of_the_export_it_serves(tiny):
    from serve import digest

    url, served, hf_dir = tiny
    stored = digest.read_manifest(hf_dir)["digest"]
    assert served.info["checkpoint_digest"] == stored == digest.verify_digest(hf_dir)
    (entry,) = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert entry["checkpoint_digest"] == stored
    assert httpx.get(f"{url}/get_server_info", timeout=30).json()["checkpoint_digest"] == stored


@pytest.mark.slow
def test_speculative_serving_needs_a_draft_head(tiny):
    _, _, hf_dir = tiny
    with pytest.raises(ValueError, match="needs an MTP draft head"):
        load_served_model(str(hf_dir), num_draft_tokens=2)


def _events(text: str) -> list:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.slow
def test_live_streams_of_several_rows_reassemble_to_the_plain_answer(tiny):
    url, served, _ = tiny
    body = dict(messages=QUESTION, tools=TOOLS, temperature=1.0, max_tokens=24, n=2, seed=3)
    plain = _post(url, **body).json()
    chunks = _events(_post(url, **body, stream=True,
                           stream_options={"include_usage": True}).text)  # fmt: skip
    assert chunks[-1]["usage"] == plain["usage"]
    for i, choice in enumerate(plain["choices"]):
        deltas = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        message = choice["message"]
        for field in ("reasoning_content", "content"):
            joined = "".join(d["delta"].get(field) or "" for d in deltas)
            assert joined == (message[field] or ""), (i, field)
        calls = [t for d in deltas for t in d["delta"].get("tool_calls", [])]
        assert [c["function"] for c in calls] == [
            c["function"] for c in message.get("tool_calls", [])
        ]
        assert deltas[-1]["finish_reason"] == choice["finish_reason"]


@pytest.mark.slow
def test_a_client_that_leaves_mid_stream_frees_its_slot(tiny):
    from serve._engine import _Call

    url, served, _ = tiny
    engine = served.engine
    body = {"model": "tiny-policy", "messages": QUESTION, "temperature": 1.0, "max_tokens": 400}
    stats = engine.stats
    before = (stats.cancelled_requests, stats.tokens)
    gate, paused = threading.Event(), concurrent.futures.Future()
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "seed": 1, "stream": True}, timeout=600
    ) as reply:
        lines = reply.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
        # Hold the decoder between two calls while the client goes away.
        engine._queue.put(_Call(lambda: gate.wait(30), paused))
    time.sleep(0.5)
    gate.set()
    paused.result(30)
    deadline = time.monotonic() + 60
    while (stats.cancelled_requests == before[0] or engine.decoder.active.any()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert stats.cancelled_requests == before[0] + 1
    assert stats.tokens - before[1] < 400 and not engine.decoder.active.any()
    assert _post(url, messages=QUESTION, max_tokens=4).json()["choices"]
