"""Trajectories to training conversations: the retry-history policy and one row per context.

A `Trajectory` records every model call of an agent episode with the exact messages it saw.
Its final conversation (`trajectory.messages`) holds them all: system, the viewer turn, and per
round the assistant turn followed by its tool results and any Hook messages. This module turns
it into `Conversation`s the SFT pipeline renders, with the loss on every assistant round.

Retry-history policy (paper §3.4). A Hook-triggered retry leaves a failed output in the record:
a rejected reply, a call with invalid arguments or to an unknown tool, a malformed turn, and the
Hook's message answering it. Training on these teaches a policy to make the avoidable error and
then fix it, so by default (`keep_retries=False`) they are removed and the final valid behaviour
stays: failed calls and their error results go, turns left without a valid call go, Hook
messages go. With `keep_retries=True` everything stays and failed turns carry `"weight": 0`
(rendered as context, never trained; a turn with one failed call among valid ones is such a
turn), so the student learns to read a Hook message and recover.
Failures of the environment (tool timeouts, malformed or denied results) are not the model's
errors: their recoveries are kept in both modes.

Rows (`split_rows`). The Qwen format drops reasoning from assistant turns before the last user
query, so after a Hook message (a user turn) earlier turns render without their reasoning,
unlike what the policy saw when it wrote them. A conversation is therefore cut into rows such
that every trained turn is rendered after exactly the prompt it was generated from; turns
trained in an earlier row are context (weight 0) in later ones. Most conversations are one row.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import chat_format

# Error types a tool result carries when the *model* erred (a Hook or the loop refused the call,
# or a Skill name did not exist). Environment faults (timeout, tool_failed, malformed, denied,
# unavailable) are deliberately absent.
MODEL_ERRORS = frozenset(
    {
        "unknown_tool",
        "invalid_arguments",
        "not_allowed",
        "rejected",
        "too_many_calls",
        "unknown_skill",
    }
)
_NOT_DELIVERED = "not_delivered"


class ConversionError(ValueError):
    """A record that cannot become a training conversation (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Conversation:
    """One training conversation.

    Attributes:
      id: the record id (logged when the record is bad).
      messages: OpenAI-style message dicts; assistant messages may carry `"weight": 0`.
      tools: the OpenAI function schemas the policy was given, or None.
    """

    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages, "tools": self.tools}


def _result_error(content: Any) -> str | None:
    """The model-error type of a tool message's content, if any."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            return None
    if not isinstance(content, Mapping):
        return None
    if content.get("status") == _NOT_DELIVERED:
        return _NOT_DELIVERED
    error = content.get("error")
    kind = error.get("type") if isinstance(error, Mapping) else None
    return kind if kind in MODEL_ERRORS else None


@dataclasses.dataclass
class _Failures:
    """Where a conversation's failed outputs and Hook interactions are (message indices)."""

    turns: set[int] = dataclasses.field(default_factory=set)  # assistant turns that erred
    malformed: set[int] = dataclasses.field(default_factory=set)  # turns the parser rejected
    calls: dict[int, set[str]] = dataclasses.field(default_factory=dict)  # turn -> failed ids
    results: set[int] = dataclasses.field(default_factory=set)  # error results of failed calls
    hook_messages: set[int] = dataclasses.field(default_factory=set)

    @property
    def any(self) -> bool:
        return bool(self.turns or self.hook_messages)


def find_failures(
    messages: Sequence[Mapping[str, Any]], malformed_turns: Sequence[bool] = ()
) -> _Failures:
    """Locates failed outputs: calls answered with a model error, replies a Hook sent back,
    turns the parser rejected (`malformed_turns[k]` for the k-th assistant turn), and the Hook
    messages (user turns after the first)."""
    out = _Failures()
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    turn, k = None, 0
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            turn = i
            if k < len(malformed_turns) and malformed_turns[k]:
                out.turns.add(i)
                out.malformed.add(i)
            k += 1
        elif role == "tool" and turn is not None and _result_error(m.get("content")):
            out.calls.setdefault(turn, set()).add(str(m.get("tool_call_id")))
            out.turns.add(turn)
            out.results.add(i)
        elif role == "user" and first_user is not None and i > first_user:
            out.hook_messages.add(i)
            if turn is not None and not messages[turn].get("tool_calls"):
                out.turns.add(turn)  # a plain-text reply the Hook sent back
    return out


def clean_retries(
    messages: Sequence[Mapping[str, Any]], malformed_turns: Sequence[bool] = ()
) -> list[dict[str, Any]]:
    """The final valid behaviour: failed outputs and Hook interactions removed.

    A turn keeps its valid calls (a malformed turn also loses its unparsable text); a turn with
    no valid call left is removed with all its results.
    """
    f = find_failures(messages, malformed_turns)
    out: list[dict[str, Any]] = []
    dropped_turn = False
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            dropped_turn = False
            if i not in f.turns:
                out.append(dict(m))
                continue
            failed = f.calls.get(i, set())
            calls = [c for c in m.get("tool_calls") or () if str(c.get("id")) not in failed]
            if not calls:
                dropped_turn = True
                continue
            kept = {k: v for k, v in m.items() if k not in ("tool_calls", "weight")}
            if i in f.malformed:
                kept["content"] = ""
            out.append({**kept, "tool_calls": calls})
        elif role == "tool":
            if not dropped_turn and i not in f.results:
                out.append(dict(m))
        elif i not in f.hook_messages:
            out.append(dict(m))
    return out


def mark_retries(
    messages: Sequence[Mapping[str, Any]], malformed_turns: Sequence[bool] = ()
) -> list[dict[str, Any]]:
    """The complete retry history, with `"weight": 0` on every turn that erred."""
    f = find_failures(messages, malformed_turns)
    return [{**m, "weight": 0} if i in f.turns else dict(m) for i, m in enumerate(messages)]


def has_retries(messages: Sequence[Mapping[str, Any]], malformed_turns: Sequence[bool] = ()):
    """Whether the conversation holds a failed output or a Hook interaction."""
    return find_failures(messages, malformed_turns).any


def malformed_turns(trajectory: Any) -> list[bool]:
    """Per assistant turn of `trajectory.messages`: whether its output had parse errors."""
    outputs = [c.output for c in trajectory.model_calls if c.output is not None]
    return [bool(o.get("parse_errors")) for o in outputs]


def trajectory_conversation(
    trajectory: Any,
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    keep_retries: bool = False,
    conversation_id: str = "",
) -> Conversation:
    """The training conversation of one trajectory under the retry-history policy.

    Args:
      trajectory: a `hat_jax.harness.Trajectory`.
      tools: the tool schemas of the Harness state it ran in (`harness.tool_schemas(state)`).
      keep_retries: keep the complete retry history (failed turns at weight 0) instead of only
        the final valid behaviour.
      conversation_id: the id reported with errors.

    Raises:
      ConversionError: the run did not end with the policy's own valid reply (fallback or
        suppression), or its record is inconsistent.
    """
    end = trajectory.final.end
    if trajectory.final.fallback or end not in ("reply", "no_reply"):
        raise ConversionError(
            f"{conversation_id}: the run ended with {end!r}, not a valid reply of the policy"
        )
    messages = list(trajectory.messages)
    malformed = malformed_turns(trajectory)
    n_turns = sum(m.get("role") == "assistant" for m in messages)
    if n_turns != len(malformed):
        raise ConversionError(
            f"{conversation_id}: {n_turns} assistant messages but {len(malformed)} model outputs"
        )
    fn = mark_retries if keep_retries else clean_retries
    out = fn(messages, malformed)
    if not out or out[-1].get("role") != "assistant" or out[-1].get("weight") == 0:
        raise ConversionError(f"{conversation_id}: no valid final assistant turn")
    return Conversation(
        id=conversation_id, messages=out, tools=list(tools) if tools is not None else None
    )


def split_rows(
    conversation: Conversation, *, enable_thinking: bool = True, preserve_thinking: bool = False
) -> list[Conversation]:
    """Cuts a conversation into rows in which each trained turn follows its own prompt.

    Turn j is trained in a row only if the text of the prompt it was generated from (the
    messages before it plus the generation prompt) is a prefix of the row's text. Rows are grown
    greedily; trailing messages after the last trained turn are dropped.

    Raises:
      ConversionError: no assistant turn to train on.
    """
    msgs = conversation.messages
    trained = [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and _weight(m)]
    if not trained:
        raise ConversionError(f"{conversation.id}: no assistant turn to train on")
    kw = dict(enable_thinking=enable_thinking, preserve_thinking=preserve_thinking)
    tools = conversation.tools

    def prompt(i: int) -> str:
        return chat_format.render(msgs[:i], tools, add_generation_prompt=True, **kw)

    rows: list[list[int]] = []
    group: list[int] = []
    prompts: dict[int, str] = {}
    for k in trained:
        prompts[k] = prompt(k)
        if group:
            text = chat_format.render(msgs[: k + 1], tools, **kw)
            if not all(text.startswith(prompts[j]) for j in group):
                rows.append(group)
                group = []
        group.append(k)
    rows.append(group)
    if len(rows) == 1:
        return [dataclasses.replace(conversation, messages=list(msgs[: rows[0][-1] + 1]))]
    out = []
    for n, group in enumerate(rows):
        keep = set(group)
        row = [
            {**m, "weight": 0} if i in trained and i not in keep else m
            for i, m in enumerate(msgs[: group[-1] + 1])
        ]
        out.append(dataclasses.replace(conversation, id=f"{conversation.id}#{n}", messages=row))
    return out


def _weight(message: Mapping[str, Any]) -> bool:
    return message.get("weight", 1) not in (0, 0.0, False)
