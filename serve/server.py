"""An OpenAI-compatible server over a local JAX policy (CPU or accelerator).

    python -m serve.server --checkpoint runs/demo/export/hf [--port 8000] [--num_draft_tokens 3]

Routes:
- `POST /v1/chat/completions`: non-streaming and streaming (SSE, `stream_options.include_usage`);
  Qwen3.5 XML tool calls returned as OpenAI `tool_calls`, reasoning as `reasoning_content`
  (`separate_reasoning: false` keeps it in the content); `chat_template_kwargs.enable_thinking`;
  `temperature`, `top_p`, `top_k`, `max_tokens` / `max_completion_tokens`, `stop`, `seed`,
  `n`, `tool_choice` "auto" | "none".
- `GET /v1/models`, `GET /health`, `GET /get_server_info` (the engine's counters and, with
  speculative decoding, `avg_spec_accept_length`, as SGLang reports it).
- Both `/get_server_info` and the model entry of `/v1/models` report `checkpoint_digest` and
  `tokenizer_digest` (`serve.digest`) of what is served, which the deployment replay records
  and the release gates compare with the candidate checkpoint.

Concurrent requests are decoded together. The default engine, `SlotEngine` (continuous
batching over `models.SlotDecoder`), admits a request into a free slot between decode steps
and retires each row when it ends, so a request never waits for a batch and a short answer
never waits for a long one; a stream sends text as it is decoded (`api.DeltaStream`: only
text certain to stay, tool calls whole at the end), so time-to-first-token is a fraction of
the latency, and a client that disconnects frees its slot at the next step. `--engine batch`
(`BatchEngine`: the requests queued during a batch decoded in one compiled call, a stream
sent once its answer is complete) is what `--num_draft_tokens` (speculative decoding) uses.
A request of a new prompt-length bucket compiles first (seconds on CPU);
`--warmup_prompt_tokens 2048,4096` compiles those lengths before serving.

Bad requests get OpenAI error JSON (`{"error": {"message", "type", "param", "code"}}`) with a
4xx status: an unknown model 404 (`model_not_found`), a prompt that leaves no room or
`max_tokens` past the context 400 (`context_length_exceeded`), malformed messages or tools
400, naming the field. The server keeps serving after any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from serve import _chat_api as api
from serve._engine import BatchEngine, EngineClosedError, SlotEngine

DIGEST_KEYS = ("checkpoint_digest", "tokenizer_digest")  # what a server says it serves


@dataclasses.dataclass
class ServedModel:
    """What a server serves: a name, a tokenizer and the engine that decodes for it.

    Attributes:
        name: the model id clients send (`/v1/models` lists it).
        tokenizer: the policy's transformers tokenizer (its chat-format tokens single tokens).
        engine: the `SlotEngine` (continuous batching, live streaming) or `BatchEngine`
            (whole batches; speculative decoding) over the policy.
        default_max_tokens: a request's completion limit when it sets none (capped by the room
            its prompt leaves).
        info: extra facts for `/get_server_info` (checkpoint, dtype, ...); its
            `checkpoint_digest` and `tokenizer_digest` are also in `/v1/models`.
    """

    name: str
    tokenizer: Any
    engine: BatchEngine | SlotEngine
    default_max_tokens: int = 2048
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def create_app(served: ServedModel, *, api_key: str | None = None) -> Starlette:
    """The ASGI app (run it with uvicorn; `main` does). The engine is closed on shutdown."""

    def authorised(request: Request) -> None:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            raise api.APIError(
                "invalid or missing API key", status=401, type="authentication_error",
                code="invalid_api_key",
            )  # fmt: skip

    async def chat_completions(request: Request) -> Response:
        authorised(request)
        try:
            body = await request.json()
        except ValueError as err:
            raise api.APIError(f"the request body is not valid JSON ({err})") from None
        chat = api.ChatRequest.parse(body)
        if chat.model != served.name:
            raise api.APIError(
                f"the model {chat.model!r} does not exist; this server serves {served.name!r}",
                status=404, param="model", code="model_not_found",
            )  # fmt: skip
        prompt_ids, budget = _prompt(served, chat)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        head = {"id": request_id, "created": int(time.time()), "model": served.name}
        if chat.stream and isinstance(served.engine, SlotEngine):
            return StreamingResponse(
                _stream_live(served, head, chat, prompt_ids, budget),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        future = served.engine.submit(
            [prompt_ids] * chat.n, max_new_tokens=budget, sampling=chat.sampling, seed=chat.seed
        )
        try:
            rows = await asyncio.wrap_future(future)
        except EngineClosedError as err:
            raise api.APIError(str(err), status=503, type="server_error") from None
        except ValueError as err:  # the sampler refused a row it was given
            raise api.APIError(str(err)) from None
        choices = [
            api.choice_for(
                served.tokenizer.decode(list(row.token_ids), skip_special_tokens=False),
                stopped=row.stopped,
                tokens=len(row.token_ids),
                request=chat,
                call_id=f"call_{request_id[9:21]}_{i}",
            )
            for i, row in enumerate(rows)
        ]
        usage = api.usage(len(prompt_ids), choices)
        if chat.stream:
            return StreamingResponse(
                _stream(head, choices, chat, usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return JSONResponse(
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": i,
                        "message": api.message_for(c, chat),
                        "finish_reason": c.finish_reason,
                        "logprobs": None,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": usage,
            }
        )

    async def models(request: Request) -> Response:
        authorised(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": served.name,
                        "object": "model",
                        "created": int(served.info.get("created", 0)),
                        "owned_by": "hat-jax",
                        "max_model_len": served.engine.max_length,
                        **{k: served.info[k] for k in DIGEST_KEYS if k in served.info},
                    }
                ],
            }
        )

    async def health(request: Request) -> Response:
        if served.engine.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "engine stopped"}, status_code=503)

    async def server_info(request: Request) -> Response:
        authorised(request)
        return JSONResponse(
            {
                "model": served.name,
                "max_length": served.engine.max_length,
                "max_batch_rows": served.engine.max_rows,
                "speculative_num_draft_tokens": served.engine.num_draft_tokens,
                "engine": type(served.engine).__name__,
                **served.engine.stats.as_dict(),
                **served.info,
            }
        )

    async def on_api_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, api.APIError)
        return JSONResponse(err.body(), status_code=err.status)

    async def on_http_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, HTTPException)
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        body = api.APIError(f"{request.method} {request.url.path}: {err.detail}", type=kind)
        return JSONResponse(body.body(), status_code=err.status_code)

    async def on_crash(request: Request, err: Exception) -> Response:
        body = api.APIError(f"internal error: {type(err).__name__}: {err}", type="server_error")
        return JSONResponse(body.body(), status_code=500)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/get_server_info", server_info, methods=["GET"]),
        ],
        exception_handlers={
            api.APIError: on_api_error,
            HTTPException: on_http_error,
            Exception: on_crash,
        },
        lifespan=_lifespan(served),
    )


def _lifespan(served: ServedModel):
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        served.engine.close()

    return lifespan


def _prompt(served: ServedModel, chat: api.ChatRequest) -> tuple[list[int], int]:
    """The request's prompt ids and completion budget (`context_length_exceeded` if none)."""
    text = api.render_prompt(chat)
    ids = served.tokenizer.encode(text, add_special_tokens=False)
    limit = served.engine.max_length
    room = limit - len(ids)
    if room < 1:
        raise api.APIError(
            f"the prompt has {len(ids)} tokens; this model's context is {limit} tokens "
            "(prompt + completion)",
            param="messages", code="context_length_exceeded",
        )  # fmt: skip
    if chat.max_tokens is None:
        return ids, min(served.default_max_tokens, room)
    if chat.max_tokens > room:
        raise api.APIError(
            f"max_tokens={chat.max_tokens} with a {len(ids)}-token prompt exceeds this model's "
            f"context of {limit} tokens (at most {room} can be generated)",
            param="max_tokens", code="context_length_exceeded",
        )  # fmt: skip
    return ids, chat.max_tokens


async def _stream(
    head: dict[str, Any], choices: list[api.Choice], chat: api.ChatRequest, usage: dict[str, int]
) -> AsyncIterator[str]:
    def event(choices_field: list[dict[str, Any]], **extra: Any) -> str:
        chunk = {**head, "object": "chat.completion.chunk", "choices": choices_field, **extra}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    for i, choice in enumerate(choices):
        for delta in api.stream_deltas(choice, chat):
            yield event([{"index": i, "delta": delta, "finish_reason": None, "logprobs": None}])
        yield event([{"index": i, "delta": {}, "finish_reason": choice.finish_reason,
                      "logprobs": None}])  # fmt: skip
    if chat.include_usage:
        yield event([], usage=usage)
    yield "data: [DONE]\n\n"


async def _stream_live(
    served: ServedModel,
    head: dict[str, Any],
    chat: api.ChatRequest,
    prompt_ids: list[int],
    budget: int,
) -> AsyncIterator[str]:
    """Streams each choice as the `SlotEngine` decodes it: deltas leave as soon as their
    text is certain (`api.DeltaStream`), tool calls and the finish reason when the row ends.
    A client that goes away cancels the request (its slots are freed at the next step)."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, list[int]] | None] = asyncio.Queue()

    def on_tokens(row: int, tokens: list[int]) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (row, tokens))

    future = served.engine.submit(
        [prompt_ids] * chat.n, max_new_tokens=budget, sampling=chat.sampling, seed=chat.seed,
        on_tokens=on_tokens,
    )  # fmt: skip
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))

    def event(choices_field: list[dict[str, Any]], **extra: Any) -> str:
        chunk = {**head, "object": "chat.completion.chunk", "choices": choices_field, **extra}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    def deltas(i: int, items: list[dict[str, Any]]) -> list[str]:
        return [event([{"index": i, "delta": d, "finish_reason": None, "logprobs": None}])
                for d in items]  # fmt: skip

    streams = [api.DeltaStream(chat) for _ in range(chat.n)]
    tokens: list[list[int]] = [[] for _ in range(chat.n)]
    try:
        for i, stream in enumerate(streams):
            for chunk in deltas(i, stream.start()):
                yield chunk
        while (item := await events.get()) is not None:
            row, new = item
            tokens[row].extend(new)
            text = served.tokenizer.decode(tokens[row], skip_special_tokens=False)
            for chunk in deltas(row, streams[row].update(text.rstrip("\ufffd"))):
                yield chunk
        try:
            rows = future.result()
        except Exception as err:  # noqa: BLE001 - the stream ends with the error
            kind = "invalid_request_error" if isinstance(err, ValueError) else "server_error"
            yield f"data: {json.dumps(api.APIError(str(err), type=kind).body())}\n\n"
            return
        choices = []
        for i, row in enumerate(rows):
            choice = api.choice_for(
                served.tokenizer.decode(list(row.token_ids), skip_special_tokens=False),
                stopped=row.stopped, tokens=len(row.token_ids), request=chat,
                call_id=f"call_{head['id'][9:21]}_{i}",
            )  # fmt: skip
            choices.append(choice)
            for chunk in deltas(i, streams[i].finish(choice)):
                yield chunk
            yield event([{"index": i, "delta": {}, "finish_reason": choice.finish_reason,
                          "logprobs": None}])  # fmt: skip
        if chat.include_usage:
            yield event([], usage=api.usage(len(prompt_ids), choices))
        yield "data: [DONE]\n\n"
    finally:
        if not future.done():  # the client went away mid-stream
            served.engine.cancel(future)


@contextlib.contextmanager
def serve_in_background(app: Starlette, *, host: str = "127.0.0.1", port: int = 0):
    """Serves `app` with uvicorn on a thread; yields the base URL (`http://host:port`).

    `port=0` picks a free port. On exit the server stops (open requests finish first).
    """
    import threading

    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(60)


def load_served_model(
    checkpoint: str,
    *,
    name: str | None = None,
    tokenizer_dir: str | None = None,
    dtype: str = "float32",
    max_length: int = 0,
    num_draft_tokens: int = 0,
    mtp_dir: str | None = None,
    max_batch_rows: int = 16,
    batch_window_s: float = 0.02,
    default_max_tokens: int = 2048,
    seed: int = 0,
    engine: str = "auto",
    decode_steps_per_call: int = 8,
) -> ServedModel:
    """A `ServedModel` of a checkpoint (Orbax or HF directory; see `serve.load_jax_policy`).

    `name` defaults to the checkpoint directory's name. `engine`: "slots" (`SlotEngine`:
    requests join and leave between decode steps, streams send tokens as they are decoded),
    "batch" (`BatchEngine`: whole batches in one compiled call, needed for speculative
    decoding), "auto" (slots, or batch with `num_draft_tokens`).
    """
    import pathlib

    from serve._jax_policy import load_jax_policy

    policy, describe = load_jax_policy(
        checkpoint, tokenizer_dir=tokenizer_dir, dtype=dtype, max_length=max_length,
        num_draft_tokens=num_draft_tokens, mtp_dir=mtp_dir,
    )  # fmt: skip
    if engine not in ("auto", "slots", "batch"):
        raise ValueError(f"engine={engine!r}: choose auto, slots or batch")
    if engine == "slots" and num_draft_tokens:
        raise ValueError("engine='slots' decodes plainly; speculative decoding needs 'batch'")
    if engine == "batch" or (engine == "auto" and num_draft_tokens):
        served_engine: BatchEngine | SlotEngine = BatchEngine(
            policy.sampler, policy.stop_tokens, max_rows=max_batch_rows,
            window_s=batch_window_s, seed=seed,
        )  # fmt: skip
    else:
        import models

        decoder = models.SlotDecoder(
            policy.model, slots=max_batch_rows, max_length=policy.sampler.max_length,
            stop_tokens=policy.stop_tokens, pad_id=policy.sampler.pad_id,
            steps_per_call=decode_steps_per_call,
        )  # fmt: skip
        served_engine = SlotEngine(decoder, seed=seed)
    path = pathlib.Path(checkpoint).resolve()
    return ServedModel(
        name=name or path.name,
        tokenizer=policy.tokenizer,
        engine=served_engine,
        default_max_tokens=default_max_tokens,
        info={**describe, "created": int(path.stat().st_mtime)},
    )


def main(argv: list[str]) -> None:
    del argv
    import uvicorn
    from absl import flags

    f = flags.FLAGS
    if f.host not in ("127.0.0.1", "localhost", "::1") and not f.api_key:
        print(f"serving on {f.host} without --api_key: anyone who can reach it may use it")
    served = load_served_model(
        f.checkpoint, name=f.model_name, tokenizer_dir=f.tokenizer_dir, dtype=f.dtype,
        max_length=f.max_length, num_draft_tokens=f.num_draft_tokens, mtp_dir=f.mtp_dir,
        max_batch_rows=f.max_batch_rows, batch_window_s=f.batch_window_ms / 1000,
        default_max_tokens=f.default_max_tokens, seed=f.seed, engine=f.engine,
        decode_steps_per_call=f.decode_steps_per_call,
    )  # fmt: skip
    lengths = [int(x) for x in f.warmup_prompt_tokens]
    if lengths:
        start = time.perf_counter()
        calls = served.engine.warmup(lengths, f.warmup_max_tokens)
        print(f"warmup: {calls} programs compiled in {time.perf_counter() - start:.1f} s")
    print(f"serving {served.name!r} ({served.info}) on http://{f.host}:{f.port}/v1")
    uvicorn.run(create_app(served, api_key=f.api_key), host=f.host, port=f.port, log_level="info")


def _define_flags() -> None:
    """The CLI's flags, defined only when this module runs as a script (importing it as a
    library defines none)."""
    from absl import flags

    flags.DEFINE_string("checkpoint", None, "An HF directory or Orbax checkpoint of the policy.")
    flags.mark_flag_as_required("checkpoint")
    flags.DEFINE_string("model_name", None, "The model id clients send (default: dir name).")
    flags.DEFINE_string("tokenizer_dir", None, "Tokenizer (default: the HF dir's, else demo).")
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
    flags.DEFINE_integer("port", 8000, "Port to listen on.")
    flags.DEFINE_string("api_key", None, "Require this bearer token (default: none).")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter/compute dtype.")
    flags.DEFINE_integer("max_length", 8192, "Cap on prompt + completion tokens (0: model's).")
    flags.DEFINE_integer("num_draft_tokens", 0, "MTP speculative drafts per step (0: off).")
    flags.DEFINE_string("mtp_dir", None, "Orbax MTP head (default: the HF dir's mtp.*).")
    flags.DEFINE_enum(
        "engine", "auto", ["auto", "slots", "batch"],
        "slots: continuous batching and live streaming; batch: whole batches (speculative "
        "decoding); auto: slots, or batch with --num_draft_tokens.",
    )  # fmt: skip
    flags.DEFINE_integer(
        "decode_steps_per_call", 8,
        "Slot engine: decode steps per compiled call (requests are admitted between calls).",
    )  # fmt: skip
    flags.DEFINE_integer("max_batch_rows", 16, "Most rows decoded together (slots or batch).")
    flags.DEFINE_float("batch_window_ms", 20.0, "How long a batch waits for more requests.")
    flags.DEFINE_integer("default_max_tokens", 2048, "Completion limit when a request has none.")
    flags.DEFINE_integer("seed", 0, "Base seed of requests that send none.")
    flags.DEFINE_list(
        "warmup_prompt_tokens", [],
        "Before serving, compile the programs requests with prompts of these lengths (tokens) need.",
    )  # fmt: skip
    flags.DEFINE_integer("warmup_max_tokens", 256, "The completion limit warmup compiles for.")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
