"""Render OpenAI-style conversations into the Qwen3.5 chat format (text), piece by piece.

What the format does, precisely (and what `chat_template.jinja` does identically):

- System turn: with tools, a `# Tools` block (one JSON schema per line inside `<tools>...</tools>`
  and the XML calling instruction), then the system message after a blank line; without tools,
  the system message alone. A system message is allowed only first.
- User turns and tool results are trimmed; consecutive `tool` messages share one
  `<|im_start|>user` turn of `<tool_response>` blocks.
- The last user query is the last user message that is not itself a wrapped
  `<tool_response>...</tool_response>`; a conversation without one is rejected. Assistant turns
  after it keep their reasoning as `<think>\\n{reasoning}\\n</think>\\n\\n` (an empty block when
  there is none); turns before it drop reasoning entirely, unless `preserve_thinking` (the
  Qwen3.6 switch) keeps it everywhere.
- Assistant tool calls use the Qwen3-Coder XML form; string arguments are written raw, all
  other values as JSON. The first call follows the content after a blank line.
- The generation prompt is `<|im_start|>assistant\\n<think>\\n`, or with `enable_thinking=False`
  an empty closed think block.

Each piece carries whether the assistant produced it, which `render_tokens` turns into the loss
mask. This module does not tokenize and does not parse model output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.chat_format import _format as fmt

# (text, trainable): trainable pieces are what the assistant produced.
Piece = tuple[str, bool]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    enable_thinking: bool = True,
    preserve_thinking: bool = False,
) -> str:
    """Renders a conversation to the text the Qwen3.5 chat template produces.

    Args:
      messages: OpenAI-style message dicts (see `hat_jax.chat_format`).
      tools: OpenAI function schemas, or None.
      add_generation_prompt: append the assistant header the model continues from.
      enable_thinking: with the generation prompt, open a think block (True) or write an
        empty closed one (False).
      preserve_thinking: keep reasoning on every assistant turn, not only after the last user
        query (the Qwen3.6 template's option).

    Returns:
      The rendered text.

    Raises:
      ValueError: a malformed conversation; the message names the message index and field.
    """
    pieces = render_pieces(
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        preserve_thinking=preserve_thinking,
    )
    return "".join(text for text, _ in pieces)


def render_completion(message: Mapping[str, Any], *, enable_thinking: bool = True) -> str:
    """The text a model writes after the generation prompt to produce `message`.

    This is the assistant turn minus the generation prompt, ending with `<|im_end|>`: what a
    sampler returns and what `parse` reads.

    Raises:
      ValueError: `message` is not a valid assistant message, or it has reasoning while
        `enable_thinking` is False (a prompt with a closed think block cannot produce it).
    """
    message = _normalise_message(message, 0)
    if message.get("role") != "assistant":
        raise ValueError(f"render_completion: expected an assistant message, got {message!r}")
    turn = _assistant_turn(message, 0, keep_reasoning=True)
    prompt = fmt.generation_prompt(enable_thinking)
    if not turn.startswith(prompt):
        raise ValueError(
            "render_completion: the message has reasoning but enable_thinking=False; "
            "a prompt with a closed think block cannot produce it"
        )
    return turn[len(prompt) :]


def render_pieces(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    enable_thinking: bool = True,
    preserve_thinking: bool = False,
) -> list[Piece]:
    """Renders a conversation as (text, trainable) pieces whose texts join to `render(...)`."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages: expected a list of message dicts, got {type(messages)!r}")
    if not messages:
        raise ValueError("messages: the conversation is empty")
    msgs = [_normalise_message(m, i) for i, m in enumerate(messages)]
    pieces: list[Piece] = []
    system = _system_turn(msgs, _check_tools(tools))
    if system:
        pieces.append((system, False))
    last_query = _last_query_index(msgs)
    for i, msg in enumerate(msgs):
        role = msg["role"]
        if role == "system":
            if i != 0:
                raise ValueError(f"messages[{i}]: a system message is allowed only first")
        elif role == "user":
            pieces.append((f"{fmt.IM_START}user\n{_text(msg, i).strip()}{fmt.IM_END}\n", False))
        elif role == "assistant":
            keep = preserve_thinking or i > last_query
            turn = _assistant_turn(msg, i, keep_reasoning=keep)
            pieces.extend(_assistant_pieces(turn, msg, i, enable_thinking))
        elif role == "tool":
            pieces.append((_tool_piece(msgs, i), False))
        else:
            raise ValueError(f"messages[{i}].role: unexpected role {role!r}")
    if add_generation_prompt:
        pieces.append((fmt.generation_prompt(enable_thinking), False))
    return pieces


def _normalise_message(message: Any, i: int) -> dict[str, Any]:
    """Drops None-valued keys and aliases reasoning fields, as transformers does for templates."""
    if not isinstance(message, Mapping):
        raise ValueError(f"messages[{i}]: expected a dict, got {type(message)!r}")
    out = {k: v for k, v in message.items() if v is not None}
    if not isinstance(out.get("role"), str):
        raise ValueError(f"messages[{i}].role: expected a string, got {out.get('role')!r}")
    reasoning = next((out[k] for k in _REASONING_KEYS if k in out), None)
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    return out


def _check_tools(tools: Any) -> list[Mapping[str, Any]]:
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ValueError(f"tools: expected a list of function schemas, got {type(tools)!r}")
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ValueError(f"tools[{j}]: expected a dict, got {type(tool)!r}")
    return list(tools)


def _text(message: Mapping[str, Any], i: int) -> str:
    """A message's content as text: a string, a list of text parts, or nothing."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, Mapping)):
        texts = []
        for j, part in enumerate(content):
            ok = isinstance(part, Mapping) and isinstance(part.get("text"), str)
            if not ok or part.get("type", "text") != "text":
                raise ValueError(f"messages[{i}].content[{j}]: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"messages[{i}].content: expected a string or text parts, got {content!r}")


def _system_turn(msgs: list[dict[str, Any]], tools: list[Mapping[str, Any]]) -> str:
    system = _text(msgs[0], 0).strip() if msgs[0]["role"] == "system" else None
    if tools:
        lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
        block = fmt.TOOLS_HEADER + lines + fmt.TOOLS_FOOTER + fmt.TOOL_INSTRUCTIONS
        if system:
            block += "\n\n" + system
        return f"{fmt.IM_START}system\n{block}{fmt.IM_END}\n"
    if system is not None:
        return f"{fmt.IM_START}system\n{system}{fmt.IM_END}\n"
    return ""


def _last_query_index(msgs: list[dict[str, Any]]) -> int:
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i]["role"] == "user":
            text = _text(msgs[i], i).strip()
            wrapped = text.startswith(fmt.TOOL_RESPONSE_OPEN) and text.endswith(
                fmt.TOOL_RESPONSE_CLOSE
            )
            if not wrapped:
                return i
    raise ValueError("messages: no user query found (every conversation needs one user message)")


def _assistant_turn(msg: Mapping[str, Any], i: int, *, keep_reasoning: bool) -> str:
    """The assistant turn from `<|im_start|>` through `<|im_end|>` (without the newline after)."""
    content = _text(msg, i).strip()
    reasoning = msg.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if fmt.THINK_CLOSE in content:
            head = content.split(fmt.THINK_CLOSE)[0].rstrip("\n")
            reasoning = head.split(fmt.THINK_OPEN)[-1].lstrip("\n")
            content = content.split(fmt.THINK_CLOSE)[-1].lstrip("\n")
    reasoning = reasoning.strip()
    if keep_reasoning:
        text = f"{fmt.THINKING_PROMPT}{reasoning}\n{fmt.THINK_CLOSE}\n\n{content}"
    else:
        text = fmt.ASSISTANT_HEADER + content
    calls = msg.get("tool_calls")
    if calls is not None and (isinstance(calls, (str, Mapping)) or not isinstance(calls, Sequence)):
        raise ValueError(f"messages[{i}].tool_calls: expected a list, got {type(calls)!r}")
    for j, call in enumerate(calls or ()):
        name, arguments = _call_fields(call, f"messages[{i}].tool_calls[{j}]")
        if j == 0:
            text += "\n\n" if content.strip() else ""
        else:
            text += "\n"
        text += f"{fmt.TOOL_CALL_OPEN}\n{fmt.FUNCTION_OPEN}{name}>\n"
        for key, value in arguments.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            text += f"{fmt.PARAMETER_OPEN}{key}>\n{shown}\n{fmt.PARAMETER_CLOSE}\n"
        text += f"{fmt.FUNCTION_CLOSE}\n{fmt.TOOL_CALL_CLOSE}"
    return text + fmt.IM_END


def _call_fields(call: Any, where: str) -> tuple[str, Mapping[str, Any]]:
    if not isinstance(call, Mapping):
        raise ValueError(f"{where}: expected a dict, got {type(call)!r}")
    function = call.get("function", call)
    if not isinstance(function, Mapping):
        raise ValueError(f"{where}.function: expected a dict, got {type(function)!r}")
    name = function.get("name")
    if not isinstance(name, str):
        raise ValueError(f"{where}.function.name: expected a string, got {name!r}")
    arguments = function.get("arguments")
    if arguments is None:
        return name, {}
    if not isinstance(arguments, Mapping):
        raise ValueError(
            f"{where}.function.arguments: expected a dict (decode JSON strings first), "
            f"got {type(arguments)!r}"
        )
    for key in arguments:
        if not isinstance(key, str):
            raise ValueError(f"{where}.function.arguments: parameter names must be strings")
    return name, arguments


def _assistant_pieces(
    turn: str, msg: Mapping[str, Any], i: int, enable_thinking: bool
) -> list[Piece]:
    """Splits an assistant turn into its forced header (not trainable) and what the model wrote.

    The header is what a generation prompt would have supplied: the full generation prompt for
    `enable_thinking` when the turn starts with it, else the opened think block, else the bare
    `<|im_start|>assistant\\n`. The `<|im_end|>` belongs to the model; the newline after it does
    not. A message with `"weight": 0` (the OpenAI fine-tuning convention) is not trainable.
    """
    weight = msg.get("weight", 1)
    if weight not in (0, 1):
        raise ValueError(f"messages[{i}].weight: expected 0 or 1, got {weight!r}")
    for header in (fmt.generation_prompt(enable_thinking), fmt.THINKING_PROMPT):
        if turn.startswith(header):
            break
    else:
        header = fmt.ASSISTANT_HEADER
    return [(header, False), (turn[len(header) :], weight == 1), ("\n", False)]


def _tool_piece(msgs: list[dict[str, Any]], i: int) -> str:
    text = ""
    if i == 0 or msgs[i - 1]["role"] != "tool":
        text += f"{fmt.IM_START}user"
    body = _text(msgs[i], i).strip()
    text += f"\n{fmt.TOOL_RESPONSE_OPEN}\n{body}\n{fmt.TOOL_RESPONSE_CLOSE}"
    if i == len(msgs) - 1 or msgs[i + 1]["role"] != "tool":
        text += f"{fmt.IM_END}\n"
    return text
