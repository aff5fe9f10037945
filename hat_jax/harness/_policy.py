"""The policy interface and its scripted test double.

A policy maps a conversation (OpenAI-style message dicts) and the tool schemas to one
`AssistantTurn`. Implementations: `ScriptedPolicy` (tests), `RuleBasedPolicy` (offline
baseline), `OpenAICompatPolicy` (any `/v1/chat/completions` endpoint) and, with the sampler, a
local JAX policy. The loop enforces time limits around `generate`, so policies need not.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from hat_jax.harness._errors import PolicyError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call of an assistant turn. `arguments` is a dict inside the library."""

    id: str
    name: str
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": dict(self.arguments)},
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class AssistantTurn:
    """What a policy produced in one model round.

    Attributes:
      content: visible text (a reply when there are no tool calls).
      reasoning: internal reasoning; never spoken, kept in the trajectory.
      tool_calls: the calls, in order.
      raw_text: the raw generated text, when the policy has it.
      token_ids, logprobs: sampled tokens and their log-probabilities, when known (for RL).
      parse_errors: problems the parser met (malformed calls, bad values) for hooks to answer.
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    raw_text: str = ""
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    parse_errors: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        object.__setattr__(self, "parse_errors", tuple(self.parse_errors))

    def to_message(self) -> dict[str, Any]:
        """The assistant message appended to the conversation."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.to_message() for c in self.tool_calls]
        return msg

    def to_dict(self) -> dict[str, Any]:
        """JSON data of the turn (for trajectories)."""
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [c.to_message() for c in self.tool_calls],
            "raw_text": self.raw_text,
            "token_ids": list(self.token_ids) if self.token_ids is not None else None,
            "logprobs": list(self.logprobs) if self.logprobs is not None else None,
            "parse_errors": list(self.parse_errors),
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Decoding settings passed through to the policy."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 1024
    seed: int | None = None
    enable_thinking: bool = True


@runtime_checkable
class PolicyModel(Protocol):
    """Anything that produces an `AssistantTurn` for a conversation.

    A policy may set a class attribute `inline = True` when `generate` is pure in-process
    computation that cannot block; the loop then calls it on its own thread (checking the
    deadline afterwards) instead of handing it to a worker thread.
    """

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
    ) -> AssistantTurn: ...


Step = (
    AssistantTurn
    | Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]], AssistantTurn]
)


class ScriptedPolicy:
    """Test double: plays back a fixed sequence of turns (or functions of the conversation).

    Args:
      steps: the turns to return in order; a callable step receives `(messages, tools)`.
      delay_s: sleep before each answer (to exercise the loop's time limits).
      repeat_last: keep returning the last step once the script is exhausted.

    Attributes:
      calls: every `(messages, tools)` received, for assertions.
    """

    def __init__(self, steps: Sequence[Step], *, delay_s: float = 0.0, repeat_last: bool = False):
        self._steps = list(steps)
        self._delay_s = delay_s
        self._repeat_last = repeat_last
        self._lock = threading.Lock()
        self.calls: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def generate(self, messages, tools, sampling=None) -> AssistantTurn:
        with self._lock:
            i = len(self.calls)
            self.calls.append((list(messages), list(tools)))
        if self._delay_s:
            time.sleep(self._delay_s)
        if i >= len(self._steps):
            if not (self._repeat_last and self._steps):
                raise PolicyError(
                    f"scripted policy has {len(self._steps)} step(s); asked for step {i + 1}"
                )
            i = len(self._steps) - 1
        step = self._steps[i]
        return step(messages, tools) if callable(step) else step


_ids = itertools.count(1)


def call(name: str, call_id: str | None = None, /, **arguments: Any) -> ToolCall:
    """Shorthand for scripts: `call("check_inventory", product_id="BT-001")`."""
    return ToolCall(id=call_id or f"call_{next(_ids)}", name=name, arguments=arguments)
