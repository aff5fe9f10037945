# Over 400 lines: one tolerant parser whose recovery rules depend on each other.
"""Parse model output in the Qwen3.5 format into reasoning, content and tool calls. Never raises.

The input is what a model wrote after the generation prompt (see `render_completion`):
`reasoning\\n</think>\\n\\ncontent` then zero or more `<tool_call>` blocks, possibly followed by
`<|im_end|>`. Small models break the format in known ways, and the parser recovers what it can:

- no `</think>`: reasoning ends at the first tool call if there is one (a warning); otherwise the
  whole output is unfinished reasoning (an error: there is no reply to give);
- tool calls written inside `<think>`: extracted and kept, removed from the reasoning (warning);
- unclosed `</parameter>`, `</function>` or `</tool_call>`: closed at the next tag, at
  `</think>` or at the end-of-turn token (warning); but a call still open when the output simply
  stops (no `<|im_end|>`: the token limit) is dropped (error), as more arguments may have been
  coming — executing half a commerce call is worse than asking again;
- a bare `<function=...>` without `<tool_call>`, or a Qwen3-style JSON call
  `{"name": ..., "arguments": {...}}` inside `<tool_call>`: accepted (warning);
- parameter values: strings as written; with the tool's JSON schema, coerced to the declared
  type (integer, number, boolean, null, object, array; unions and anyOf/oneOf in that order of
  preference), a value that fits none being kept as text with an error; without a schema,
  values that look like JSON objects or arrays are decoded and scalars stay strings.

`errors` are problems the policy must be told about (the Harness hooks answer them);
`warnings` are repairs that kept the policy's evident intent. Checking that a tool exists and
that its arguments satisfy the schema is the Harness's job, not the parser's.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.chat_format import _format as fmt

_CALL_START = re.compile(r"<tool_call>|<function=")
_FUNCTION_TAG = re.compile(r"<function=([^>\n]*)>")
_PARAMETER_TAG = re.compile(r"<parameter=([^>\n]*)>")
_STRAY_TAGS = re.compile(r"</?think>|</?tool_call>|</function>|</parameter>")
_INTEGER = re.compile(r"[-+]?\d+")
_LITERAL_LIMIT = 10_000
_TYPE_ORDER = ("null", "boolean", "integer", "number", "object", "array", "string")


@dataclasses.dataclass(frozen=True)
class ParsedToolCall:
    """One parsed tool call: the function name and its decoded arguments."""

    name: str
    arguments: dict[str, Any]

    def to_dict(self, call_id: str) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry for this call."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": dict(self.arguments)},
        }


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn recovered from model output.

    Attributes:
      reasoning: the think block's text (stripped), "" if none.
      content: the reply text outside think and tool calls (stripped).
      tool_calls: calls in the order written (those inside think first).
      errors: problems to report back to the policy; empty for well-formed output.
      warnings: repairs made to malformed but unambiguous output.
    """

    reasoning: str
    content: str
    tool_calls: list[ParsedToolCall]
    errors: list[str]
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_message(self, call_ids: Sequence[str] | None = None) -> dict[str, Any]:
        """The OpenAI-style assistant message; call ids default to `call_0`, `call_1`, ..."""
        ids = list(call_ids) if call_ids is not None else []
        ids += [f"call_{i}" for i in range(len(ids), len(self.tool_calls))]
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [c.to_dict(i) for c, i in zip(self.tool_calls, ids)]
        return message


class _Report:
    def __init__(self):
        self.errors: list[str] = []
        self.warnings: list[str] = []


def parse(
    text: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    enable_thinking: bool = True,
) -> ParsedTurn:
    """Parses model output after the generation prompt; see the module docstring.

    Args:
      text: the generated text (with or without the trailing `<|im_end|>`).
      tools: OpenAI function schemas, used to coerce parameter values to their types.
      enable_thinking: whether the generation prompt opened a think block; with False, output
        without `</think>` is all reply.

    Returns:
      A `ParsedTurn`; problems are in `errors`/`warnings`, never raised.
    """
    report = _Report()
    if not isinstance(text, str):
        report.errors.append(f"model output is not text: {type(text).__name__}")
        return ParsedTurn("", "", [], report.errors, report.warnings)
    try:
        schemas = _parameter_schemas(tools)
        body, stopped = _strip_stop(text, report)
        reasoning, rest = _split_thinking(body, enable_thinking, report)
        # Inside think a call runs at most to </think>: the model moved on, it was not cut off.
        think_calls, reasoning = _extract_calls(reasoning, schemas, report, in_think=True)
        if think_calls:
            report.warnings.append(
                f"{len(think_calls)} tool call(s) written inside <think>; accepted"
            )
        calls, content = _extract_calls(rest, schemas, report, may_be_cut=not stopped)
        content = _drop_stray_tags(content, "content", report)
        reasoning = _drop_stray_tags(reasoning, "reasoning", report)
    except Exception as e:  # the agent loop must survive any model output
        report.errors.append(f"internal parser error: {type(e).__name__}: {e}")
        return ParsedTurn("", "", [], report.errors, report.warnings)
    return ParsedTurn(reasoning, content, think_calls + calls, report.errors, report.warnings)


def _strip_stop(text: str, report: _Report) -> tuple[str, bool]:
    """Cuts the output at the first `<|im_end|>` (or `<|endoftext|>`); says if there was one."""
    cut = min(
        (i for i in (text.find(fmt.IM_END), text.find(fmt.END_OF_TEXT)) if i >= 0), default=-1
    )
    if cut < 0:
        return text, False
    tail = text[cut:].replace(fmt.IM_END, "").replace(fmt.END_OF_TEXT, "")
    if tail.strip():
        report.warnings.append("text after the end-of-turn token ignored")
    return text[:cut], True


def _split_thinking(text: str, enable_thinking: bool, report: _Report) -> tuple[str, str]:
    """Splits (reasoning, rest) at the first `</think>`."""
    body = text.lstrip()
    opened = enable_thinking
    if body.startswith(fmt.THINK_OPEN):
        text, opened = body[len(fmt.THINK_OPEN) :], True
    if fmt.THINK_CLOSE in text:
        reasoning, rest = text.split(fmt.THINK_CLOSE, 1)
        return reasoning, rest
    if not opened:
        return "", text
    start = _CALL_START.search(text)
    if start:
        report.warnings.append("missing </think>: reasoning taken to end at the first tool call")
        return text[: start.start()], text[start.start() :]
    report.errors.append("unclosed <think>: the output ended inside its reasoning (no </think>)")
    return text, ""


def _extract_calls(
    text: str,
    schemas: dict[str, dict[str, Any]],
    report: _Report,
    *,
    in_think: bool = False,
    may_be_cut: bool = False,
) -> tuple[list[ParsedToolCall], str]:
    """Pulls every tool call out of `text`; returns the calls and the remaining text.

    With `may_be_cut` (the output has no end-of-turn token), a call still open at the end of
    the text may have been cut off by the token limit and is dropped unless `</function>` came.
    """
    calls: list[ParsedToolCall] = []
    kept: list[str] = []
    pos = 0
    while (start := _CALL_START.search(text, pos)) is not None:
        kept.append(text[pos : start.start()])
        if start.group() == fmt.TOOL_CALL_OPEN:
            body, pos, closed = _block(
                text, start.end(), fmt.TOOL_CALL_CLOSE, (fmt.TOOL_CALL_OPEN,)
            )
        else:
            report.warnings.append("<function=...> without an enclosing <tool_call>; accepted")
            body, pos, closed = _block(
                text, start.start(), fmt.FUNCTION_CLOSE, (fmt.TOOL_CALL_OPEN, fmt.FUNCTION_OPEN), 1
            )
            # A closed bare function counts as a closed call: its missing wrapper is reported.
            body = body + fmt.FUNCTION_CLOSE if closed else body
        cut = may_be_cut and not closed and pos == len(text)
        call = _parse_call(body, closed, cut, schemas, report)
        if call is not None:
            calls.append(call)
    kept.append(text[pos:])
    segments = [s.strip() for s in kept]
    if calls and not in_think and any(segments[1:]):
        report.warnings.append("text after a tool call (the format allows text only before)")
    return calls, "\n\n".join(s for s in segments if s)


def _block(
    text: str, start: int, close: str, reopen: tuple[str, ...], skip: int = 0
) -> tuple[str, int, bool]:
    """The body from `start` to `close` (exclusive), the position after it, and if it closed.

    A block not closed before the next opening tag in `reopen` (searched from `start + skip`)
    ends there instead, as does one running to the end of the text.
    """
    end = text.find(close, start)
    next_open = min(
        (i for i in (text.find(tag, start + skip) for tag in reopen) if i >= 0), default=-1
    )
    if end >= 0 and (next_open < 0 or end < next_open):
        return text[start:end], end + len(close), True
    stop = next_open if next_open >= 0 else len(text)
    return text[start:stop], stop, False


def _parse_call(
    body: str, closed: bool, cut: bool, schemas: dict[str, dict[str, Any]], report: _Report
) -> ParsedToolCall | None:
    if body.strip().startswith("{"):
        return _parse_json_call(body, report)
    tag = _FUNCTION_TAG.search(body)
    if tag is None:
        report.errors.append(f"tool call without <function=NAME>: {_clip(body)!r}; dropped")
        return None
    name = tag.group(1).strip()
    if not name:
        report.errors.append("tool call with an empty function name; dropped")
        return None
    if body[: tag.start()].strip():
        report.warnings.append(f"text before <function={name}> inside <tool_call> ignored")
    fn_end = body.find(fmt.FUNCTION_CLOSE, tag.end())
    fn_closed = fn_end >= 0
    if fn_closed and body[fn_end + len(fmt.FUNCTION_CLOSE) :].strip():
        report.warnings.append(f"text after </function> in the call to {name!r} ignored")
    fn_body = body[tag.end() : fn_end if fn_closed else len(body)]
    if cut and not fn_closed:
        last = list(_PARAMETER_TAG.finditer(fn_body))[-1:]
        inside = last and fmt.PARAMETER_CLOSE not in fn_body[last[0].end() :]
        where = f"inside parameter {last[0].group(1).strip()!r}" if inside else "before </function>"
        report.errors.append(f"call to {name!r} cut off {where} (output ended); dropped")
        return None
    arguments = _parse_parameters(name, fn_body, schemas, report)
    if not (closed and fn_closed):
        missing = " and ".join(
            t
            for t, ok in ((fmt.FUNCTION_CLOSE, fn_closed), (fmt.TOOL_CALL_CLOSE, closed))
            if not ok
        )
        report.warnings.append(f"call to {name!r} missing {missing}; closed")
    return ParsedToolCall(name, arguments)


def _parse_parameters(
    name: str, body: str, schemas: dict[str, dict[str, Any]], report: _Report
) -> dict[str, Any]:
    """Decodes `<parameter=K>\\nV\\n</parameter>` blocks; an unclosed one ends at the next."""
    arguments: dict[str, Any] = {}
    tags = list(_PARAMETER_TAG.finditer(body))
    if body[: tags[0].start() if tags else len(body)].strip():
        report.warnings.append(f"stray text in the call to {name!r} ignored")
    for k, tag in enumerate(tags):
        key = tag.group(1).strip()
        limit = tags[k + 1].start() if k + 1 < len(tags) else len(body)
        end = body.find(fmt.PARAMETER_CLOSE, tag.end(), limit)
        if end < 0:
            report.warnings.append(f"parameter {key!r} of {name!r} missing </parameter>; closed")
            end = limit
        elif body[end + len(fmt.PARAMETER_CLOSE) : limit].strip():
            report.warnings.append(f"stray text after parameter {key!r} of {name!r} ignored")
        value = body[tag.end() : end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if not key:
            report.errors.append(f"parameter with an empty name in the call to {name!r}; ignored")
            continue
        if key in arguments:
            report.warnings.append(f"parameter {key!r} of {name!r} given twice; last kept")
        arguments[key] = _coerce(value, schemas.get(name, {}).get(key), f"{name}.{key}", report)
    return arguments


def _parse_json_call(body: str, report: _Report) -> ParsedToolCall | None:
    """Accepts the Qwen3 JSON form `{"name": ..., "arguments": {...}}`."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        report.errors.append(f"tool call is neither XML nor valid JSON: {_clip(body)!r}; dropped")
        return None
    args = obj.get("arguments", {}) if isinstance(obj, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            args = None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(args, dict)):
        report.errors.append(f"JSON tool call lacks a name or object arguments: {_clip(body)!r}")
        return None
    report.warnings.append(f"call to {obj['name']!r} in JSON form instead of XML; accepted")
    return ParsedToolCall(obj["name"], args)


def _parameter_schemas(tools: Any) -> dict[str, dict[str, Any]]:
    """Maps function name -> parameter name -> JSON schema, skipping malformed entries."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        params = fn.get("parameters") if isinstance(fn, Mapping) else None
        props = params.get("properties") if isinstance(params, Mapping) else None
        if (
            isinstance(fn, Mapping)
            and isinstance(fn.get("name"), str)
            and isinstance(props, Mapping)
        ):
            out[fn["name"]] = {k: v for k, v in props.items() if isinstance(v, Mapping)}
    return out


def _coerce(value: str, schema: Any, where: str, report: _Report) -> Any:
    """Decodes a parameter value written as text, guided by its schema when there is one."""
    types = _schema_types(schema)
    if not types:
        if value.strip()[:1] in ("{", "["):
            decoded, ok = _decode_container(value, ("object", "array"))
            if ok:
                return decoded
            report.warnings.append(
                f"parameter {where} looks like JSON but does not parse; kept as text"
            )
        return value
    for kind in sorted(types, key=_TYPE_ORDER.index):
        decoded, ok = _decode_as(value, kind)
        if ok:
            return decoded
    report.errors.append(
        f"parameter {where}: expected {' or '.join(sorted(types, key=_TYPE_ORDER.index))}, "
        f"got {_clip(value)!r}"
    )
    return value


def _schema_types(schema: Any) -> set[str]:
    """The JSON types a schema admits (from `type`, `enum`, `const`, `anyOf`/`oneOf`)."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types = {kind}
    elif isinstance(kind, list):
        types = {k for k in kind if isinstance(k, str)}
    else:
        types = set()
        for key in ("anyOf", "oneOf"):
            for sub in schema.get(key) or ():
                types |= _schema_types(sub)
        values = list(schema.get("enum") or ()) + ([schema["const"]] if "const" in schema else [])
        types |= {_json_type(v) for v in values}
    return {t for t in types if t in _TYPE_ORDER}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _decode_as(value: str, kind: str) -> tuple[Any, bool]:
    text = value.strip()
    if kind == "string":
        return value, True
    if kind == "null":
        return None, text in ("null", "None")
    if kind == "boolean":
        lowered = text.lower()
        return lowered == "true", lowered in ("true", "false")
    if kind == "integer":
        if _INTEGER.fullmatch(text):
            return int(text), True
        number, ok = _decode_as(value, "number")
        if ok and isinstance(number, float) and number.is_integer():
            return int(number), True
        return None, False
    if kind == "number":
        try:
            number = json.loads(text)
        except ValueError:
            return None, False
        ok = isinstance(number, (int, float)) and not isinstance(number, bool)
        return number, ok
    return _decode_container(value, (kind,))


def _decode_container(value: str, kinds: tuple[str, ...]) -> tuple[Any, bool]:
    """JSON (or, failing that, a Python literal) that decodes to one of `kinds`."""
    wanted = tuple(dict if k == "object" else list for k in kinds)
    # Python literals are a repair for small values; parsing a long one is too slow to risk.
    decoders = (json.loads, ast.literal_eval) if len(value) <= _LITERAL_LIMIT else (json.loads,)
    for decode in decoders:
        try:
            decoded = decode(value.strip())
            if decode is ast.literal_eval:  # tuples, sets, bytes...: keep only what JSON holds
                decoded = json.loads(json.dumps(decoded))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, OverflowError):
            continue
        if isinstance(decoded, wanted):
            return decoded, True
    return None, False


def _drop_stray_tags(text: str, where: str, report: _Report) -> str:
    if not _STRAY_TAGS.search(text):
        return text.strip()
    report.warnings.append(f"stray format tags removed from the {where}")
    return _STRAY_TAGS.sub("", text).strip()


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
