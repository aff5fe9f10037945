"""The OpenAI chat-completions wire format: request checks and response bodies.

`ChatRequest.parse` turns a request body into what the engine needs, raising `APIError`
(status, OpenAI error type, the offending field) for anything it cannot serve. `message_for`
and `stream_chunks` build the response from a completion's text: reasoning separated
(`reasoning_content`) and Qwen3.5 XML tool calls turned into `tool_calls` with
JSON-string arguments, as SGLang's `qwen3` reasoning and `qwen3_coder` tool-call parsers do.
Output that names tools but does not parse (a cut or malformed call) is returned as text
content with no `tool_calls`, so a client sees what the model wrote.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import models
from hat_jax import chat_format

_MAX_STOPS = 4
_MAX_N = 16
_UNSUPPORTED = {
    "logprobs": "log-probabilities",
    "top_logprobs": "log-probabilities",
    "response_format": "structured output",
    "logit_bias": "logit bias",
    "audio": "audio output",
}


class APIError(Exception):
    """An error answered as OpenAI error JSON with an HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",  # noqa: A002 - the wire field's name
    ):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.type = (
            message, status, param, code, type,
        )  # fmt: skip

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked `/v1/chat/completions` request."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    parse_tools: bool  # tool_choice != "none": turn written calls into tool_calls
    sampling: models.Sampling
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    n: int
    stream: bool
    include_usage: bool
    enable_thinking: bool
    separate_reasoning: bool

    @classmethod
    def parse(cls, body: Any) -> ChatRequest:
        if not isinstance(body, Mapping):
            raise APIError("the request body must be a JSON object")
        for key, what in _UNSUPPORTED.items():
            if body.get(key) not in (None, False):
                raise APIError(f"{key}: {what} is not supported by this server", param=key)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise APIError("model: a model name (string) is required", param="model")
        tools = _tools(body.get("tools"))
        choice = body.get("tool_choice", "auto")
        if choice not in ("auto", "none"):
            raise APIError(
                f"tool_choice: only 'auto' and 'none' are supported, got {choice!r}",
                param="tool_choice",
            )
        kwargs = _object(body.get("chat_template_kwargs"), "chat_template_kwargs")
        enable_thinking = _flag(kwargs.get("enable_thinking", True), "chat_template_kwargs")
        options = _object(body.get("stream_options"), "stream_options")
        return cls(
            model=model,
            messages=_messages(body.get("messages")),
            tools=tools,
            parse_tools=bool(tools) and choice != "none",
            sampling=_sampling(body),
            max_tokens=_max_tokens(body),
            stop=_stops(body.get("stop")),
            seed=_integer(body.get("seed"), "seed"),
            n=_count(body.get("n")),
            stream=_flag(body.get("stream", False), "stream"),
            include_usage=_flag(options.get("include_usage", False), "stream_options"),
            enable_thinking=enable_thinking,
            separate_reasoning=_flag(body.get("separate_reasoning", True), "separate_reasoning"),
        )


def _object(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise APIError(f"{name}: expected an object, got {value!r}", param=name)
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise APIError(f"{name}: expected true or false, got {value!r}", param=name)
    return value


def _integer(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{name}: expected an integer, got {value!r}", param=name)
    return value


def _count(value: Any) -> int:
    n = _integer(value, "n")
    if n is None:
        return 1
    if not 1 <= n <= _MAX_N:
        raise APIError(f"n: must be between 1 and {_MAX_N}, got {n}", param="n")
    return n


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise APIError(f"{name}: expected a number in [{low}, {high}], got {value!r}", param=name)
    return float(value)


def _sampling(body: Mapping[str, Any]) -> models.Sampling:
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    top_k = _integer(body.get("top_k"), "top_k") or 0
    if top_k < 0:
        top_k = 0  # SGLang and vLLM read -1 as "no limit"
    if top_p == 0.0:
        raise APIError("top_p: must be > 0", param="top_p")
    return models.Sampling(temperature=temperature, top_p=top_p, top_k=top_k)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    value = _integer(body.get(name), name)
    if value is not None and value < 1:
        raise APIError(f"{name}: must be >= 1, got {value}", param=name)
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or len(stops) > _MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise APIError(
            f"stop: expected a non-empty string or a list of at most {_MAX_STOPS}, got {value!r}",
            param="stop",
        )
    return tuple(stops)


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError(f"tools: expected a list of function tools, got {value!r}", param="tools")
    for j, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, Mapping)
            or not isinstance(fn.get("name"), str)
            or not fn["name"]
            or not isinstance(fn.get("parameters", {}), Mapping)
        ):
            raise APIError(
                f"tools[{j}]: expected {{'type': 'function', 'function': {{'name': str, "
                f"'parameters': object}}}}, got {tool!r}"[:300],
                param=f"tools[{j}]",
            )
    return [dict(t) for t in value]


def _messages(value: Any) -> list[dict[str, Any]]:
    """Wire messages as chat-format messages (tool-call arguments decoded from JSON)."""
    if not isinstance(value, list) or not value:
        raise APIError("messages: expected a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise APIError(f"{where}: expected an object, got {message!r}", param=where)
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise APIError(f"{where}.role: unknown role {role!r}", param=f"{where}.role")
        msg = {k: v for k, v in message.items() if v is not None}
        msg["role"] = role
        if message.get("tool_calls"):
            msg["tool_calls"] = _wire_calls(message["tool_calls"], where)
        out.append(msg)
    return out


def _wire_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise APIError(f"{where}.tool_calls: expected a list", param=f"{where}.tool_calls")
    decoded = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise APIError(f"{at}: expected {{'function': {{'name', 'arguments'}}}}", param=at)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as err:
                raise APIError(
                    f"{at}.function.arguments: not valid JSON ({err})", param=at
                ) from None
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise APIError(f"{at}.function.arguments: expected a JSON object", param=at)
        decoded.append({**call, "function": {"name": fn["name"], "arguments": dict(args)}})
    return decoded


def render_prompt(request: ChatRequest) -> str:
    """The prompt text of a request (chat format errors become `APIError`s)."""
    try:
        return chat_format.render(
            request.messages,
            request.tools or None,
            add_generation_prompt=True,
            enable_thinking=request.enable_thinking,
        )
    except ValueError as err:
        raise APIError(str(err), param="messages") from None


# Responses.


@dataclasses.dataclass(frozen=True)
class Choice:
    """One generated answer: the assistant message's parts and why it ended."""

    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    completion_tokens: int


def choice_for(
    text: str, *, stopped: bool, tokens: int, request: ChatRequest, call_id: str
) -> Choice:
    """Reads one completion's text (cut at a stop string first) into a `Choice`."""
    cut = min((i for i in (text.find(s) for s in request.stop) if i >= 0), default=-1)
    if cut >= 0:
        text, stopped = text[:cut], True
    parsed = chat_format.parse(text, request.tools or None, enable_thinking=request.enable_thinking)
    calls: list[dict[str, Any]] = []
    content = parsed.content
    if request.parse_tools and parsed.tool_calls and not parsed.errors:
        calls = [
            {
                "id": f"{call_id}_{j}",
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": json.dumps(c.arguments, ensure_ascii=False),
                },
            }
            for j, c in enumerate(parsed.tool_calls)
        ]
    elif parsed.tool_calls or parsed.errors:
        content = _text_after_reasoning(text, request.enable_thinking)
    finish = "tool_calls" if calls else ("stop" if stopped else "length")
    return Choice(parsed.reasoning, content, calls, finish, tokens)


def _text_after_reasoning(text: str, enable_thinking: bool) -> str:
    """The raw output after the think block (calls left as written), stop token removed."""
    for end in ("<|im_end|>", "<|endoftext|>"):
        text = text.split(end)[0]
    if enable_thinking and "</think>" in text:
        text = text.split("</think>", 1)[1]
    elif enable_thinking:
        return ""  # cut off inside reasoning: all of it is reasoning
    return text.strip()


def message_for(choice: Choice, request: ChatRequest) -> dict[str, Any]:
    """The non-streaming `choices[i].message`."""
    reasoning, content = choice.reasoning, choice.content
    if not request.separate_reasoning and reasoning:
        content, reasoning = f"<think>\n{reasoning}\n</think>\n\n{content}", ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not choice.tool_calls else None,
        "reasoning_content": reasoning or None,
    }
    if choice.tool_calls:
        message["tool_calls"] = choice.tool_calls
    return message


_PIECES = re.compile(r"\s*\S+|\s+")


def stream_deltas(choice: Choice, request: ChatRequest) -> Iterator[dict[str, Any]]:
    """The deltas of one choice, in order: role, reasoning and content a word at a time,
    then each tool call whole; concatenated they give `message_for`'s fields."""
    message = message_for(choice, request)
    yield {"role": "assistant", "content": ""}
    for piece in _PIECES.findall(message["reasoning_content"] or ""):
        yield {"reasoning_content": piece}
    for piece in _PIECES.findall(message["content"] or ""):
        yield {"content": piece}
    for j, call in enumerate(choice.tool_calls):
        yield {"tool_calls": [{"index": j, **call}]}


class DeltaStream:
    """The deltas of one choice while it is being decoded (the server's token streaming).

    `update(text)` takes the completion's text so far and returns the deltas it can already
    send; `finish(choice)` returns the rest once the completion is parsed. Concatenated,
    every `reasoning_content` and `content` delta gives `message_for`'s field exactly (tool
    calls are sent whole at the end, as `stream_deltas` sends them).

    Text is sent only while it is certain to stay: up to the first `<` (a tag: `</think>`,
    a tool call, the end-of-turn token, any stray tag: what follows is left to the parser),
    before the first stop string, without trailing whitespace (the parser strips it), and
    not the last characters, which could begin a tag or a stop string. Reasoning streams
    while the think block is open; content streams after `</think>` (or, without thinking,
    from the start). With `separate_reasoning: false` nothing streams before the end (the
    reasoning is wrapped into the content only once it is complete). Without thinking, a
    model that writes `</think>` after its reply began would turn that text into reasoning
    on parsing; the streamed content then stands as sent, and `consistent` is False.
    """

    def __init__(self, request: ChatRequest):
        self.request = request
        self.sent = {"reasoning_content": "", "content": ""}
        self.consistent = True
        self._hold = max([len(chat_format.THINK_CLOSE), *map(len, request.stop)]) - 1

    def start(self) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": ""}]

    def update(self, text: str) -> list[dict[str, Any]]:
        if not self.request.separate_reasoning:
            return []
        ends = (*self.request.stop, "<|im_end|>", "<|endoftext|>")
        stop = min((i for i in (text.find(s) for s in ends) if i >= 0), default=len(text))
        safe = text[: max(min(stop, len(text) - self._hold), 0)]
        reasoning, content = self._regions(safe)
        out = []
        for field, region in (("reasoning_content", reasoning), ("content", content)):
            if region is None:
                continue
            ready = region.split("<", 1)[0].lstrip().rstrip()
            sent = self.sent[field]
            if len(ready) > len(sent) and ready.startswith(sent):
                out.append({field: ready[len(sent) :]})
                self.sent[field] = ready
        return out

    def _regions(self, safe: str) -> tuple[str | None, str | None]:
        """(reasoning text, content text) of the safe text; None where nothing may stream."""
        close = chat_format.THINK_CLOSE
        if not self.request.enable_thinking:
            return None, (None if safe.lstrip().startswith("<") else safe)
        body = safe.lstrip()
        if body.startswith(chat_format.THINK_OPEN):
            body = body[len(chat_format.THINK_OPEN) :]
        if close in body:
            reasoning, content = body.split(close, 1)
            return reasoning, content
        return body, None

    def finish(self, choice: Choice) -> list[dict[str, Any]]:
        """The remaining deltas of the parsed choice (then each tool call whole)."""
        message = message_for(choice, self.request)
        out = []
        for field in ("reasoning_content", "content"):
            final, sent = message[field] or "", self.sent[field]
            if not final.startswith(sent):
                self.consistent = False
                continue
            if len(final) > len(sent):
                out.append({field: final[len(sent) :]})
        for j, call in enumerate(choice.tool_calls):
            out.append({"tool_calls": [{"index": j, **call}]})
        return out


def usage(prompt_tokens: int, choices: Sequence[Choice]) -> dict[str, int]:
    completion = sum(c.completion_tokens for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
