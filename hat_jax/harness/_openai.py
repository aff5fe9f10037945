"""`OpenAICompatPolicy`: a policy served by any `/v1/chat/completions` endpoint.

Works with SGLang (`--tool-call-parser qwen3_coder --reasoning-parser qwen3`), vLLM and hosted
APIs. The request is a plain OpenAI one unless `server_extensions=True` adds SGLang's
`chat_template_kwargs` (thinking on or off per turn) and `separate_reasoning`, which strict
hosted APIs reject. Transient failures (HTTP 429 and 5xx, timeouts, lost connections) are
retried (see `hat_jax.llm_client.post_chat`); `stats` counts calls, retries and failures.

Structured tool calls from the server are used as they come; when a server returns tool calls
as raw text instead, `hat_jax.chat_format.parse` recovers them. Arguments that are not a JSON
object become parse errors, which the `well_formed_output` hook answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from hat_jax import chat_format, llm_client
from hat_jax.harness._errors import PolicyError
from hat_jax.harness._policy import AssistantTurn, SamplingParams, ToolCall

_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.S)


def _to_wire(message: Mapping[str, Any]) -> dict[str, Any]:
    """Library message -> chat-completions message (tool arguments as JSON strings)."""
    out = {k: v for k, v in message.items() if k not in ("reasoning_content", "tool_calls")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False),
                },
            }
            for c in message["tool_calls"]
        ]
    return out


def chat_payload(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    sampling: SamplingParams,
    *,
    server_extensions: bool = False,
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat-completions request body of one turn (shared by `OpenAICompatPolicy` and the
    deployment replay's streaming client)."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": [_to_wire(m) for m in messages],
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
    }
    if server_extensions:
        payload["chat_template_kwargs"] = {"enable_thinking": sampling.enable_thinking}
        payload["separate_reasoning"] = True
    payload.update(extra_body or {})
    if tools:
        payload.update(tools=list(tools), tool_choice="auto")
    if sampling.seed is not None:
        payload["seed"] = sampling.seed
    return payload


def _parse_text_calls(content: str) -> tuple[str, str, list[ToolCall], list[str]]:
    """Tool calls written as text (a server without a tool-call parser), via the chat format."""
    # A closing think tag means the server did not split off the reasoning: the text starts
    # inside the think block the generation prompt opened. Otherwise it is plain content.
    parsed = chat_format.parse(content, enable_thinking="</think>" in content)
    calls = [
        ToolCall(id=f"call_text_{i}", name=c.name, arguments=dict(c.arguments))
        for i, c in enumerate(parsed.tool_calls)
    ]
    return parsed.content, parsed.reasoning, calls, list(parsed.errors)


def turn_from_message(message: Mapping[str, Any]) -> AssistantTurn:
    """Chat-completions `choices[0].message` -> `AssistantTurn` (errors become parse errors)."""
    raw = content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    calls, errors = [], []
    for i, c in enumerate(message.get("tool_calls") or ()):
        fn = c.get("function") or {}
        name, args = fn.get("name") or "", fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as err:
                errors.append(f"arguments of {name or 'a tool call'} are not valid JSON ({err})")
                continue
        if not isinstance(args, dict) or not name:
            errors.append(f"tool call {i} needs a name and an object of arguments")
            continue
        calls.append(ToolCall(id=c.get("id") or f"call_{i}", name=name, arguments=args))
    if not calls and not errors and "<tool_call>" in raw:
        # No server-side tool parser: read calls (even inside think) with the chat format.
        content, extra, calls, errors = _parse_text_calls(raw)
        reasoning = "\n".join(x for x in (reasoning, extra) if x)
    elif "<think>" in content or "</think>" in content:
        reasoning = "\n".join([reasoning, *_THINK.findall(content)]).strip()
        content = _THINK.sub("", content).split("</think>")[-1].strip()
    return AssistantTurn(
        content=content,
        reasoning=reasoning,
        tool_calls=tuple(calls),
        raw_text=raw,
        parse_errors=tuple(errors),
    )


class OpenAICompatPolicy:
    """A policy behind an OpenAI-compatible chat-completions endpoint.

    Args:
      base_url: the API root, e.g. `http://localhost:30000/v1`.
      model: the model name the server expects.
      api_key: sent as a bearer token when given.
      timeout_s: HTTP timeout per attempt (the loop also enforces its trajectory budget).
      extra_body: extra request fields (e.g. `{"top_k": 20}`).
      server_extensions: also send SGLang's `chat_template_kwargs` (`enable_thinking` from the
        sampling parameters) and `separate_reasoning`; off for hosted APIs that reject unknown
        fields.
      retry: how transient failures are retried (default: `llm_client.DEFAULT_RETRY`).
      transport: an `httpx` transport (tests).

    Attributes:
      stats: `llm_client.CallStats` of every turn requested (calls, retries, failures).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        extra_body: Mapping[str, Any] | None = None,
        server_extensions: bool = False,
        retry: llm_client.RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model, self.extra_body = model, dict(extra_body or {})
        self.server_extensions = server_extensions
        self.retry = retry or llm_client.DEFAULT_RETRY
        self.stats = llm_client.CallStats()
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def payload(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
    ) -> dict[str, Any]:
        """The request body of one turn."""
        return chat_payload(
            self.model, messages, tools, sampling,
            server_extensions=self.server_extensions, extra_body=self.extra_body,
        )  # fmt: skip

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        payload = self.payload(messages, tools, sampling or SamplingParams())
        try:
            message = llm_client.post_chat(
                self._client, "/chat/completions", payload, retry=self.retry, stats=self.stats
            )
        except llm_client.ChatError as err:
            raise PolicyError(str(err)) from err
        return turn_from_message(message)
