"""The Qwen3.5 chat format: render conversations to text and tokens, parse model output.

Conversations are lists of OpenAI-style message dicts::

    {"role": "system" | "user" | "assistant" | "tool", "content": str,
     "reasoning_content": str,                    # assistant, optional
     "tool_calls": [{"id": str, "type": "function",
                     "function": {"name": str, "arguments": dict}}],   # assistant, optional
     "weight": 0 | 1,                             # assistant, optional: 0 = not trained on
     "tool_call_id": str, "name": str}            # tool

and tools are OpenAI function schemas `{"type": "function", "function": {"name",
"description", "parameters"}}`.

- `render` gives the text the Qwen3.5 chat template gives (`CHAT_TEMPLATE`, the same format as
  a Jinja file, renders identically through `tokenizer.apply_chat_template`). Reasoning is kept
  (as `<think>\\n...\\n</think>\\n\\n`) only on assistant turns after the last user query — the
  last user message that is not a wrapped `<tool_response>` — and dropped from earlier ones,
  unless `preserve_thinking=True`.
- `render_tokens` gives the token ids of that text and a loss mask that is 1 exactly on the
  assistant's own tokens.
- `render_completion` gives what a model writes for one assistant message after the generation
  prompt; `parse` reads such text back into reasoning, content and tool calls, reporting
  malformed output as errors instead of raising.
"""

from hat_jax.chat_format._format import FORMAT_TOKENS, THINK_CLOSE, THINK_OPEN, generation_prompt
from hat_jax.chat_format._parse import ParsedToolCall, ParsedTurn, parse
from hat_jax.chat_format._render import render, render_completion
from hat_jax.chat_format._template import CHAT_TEMPLATE, chat_template_path
from hat_jax.chat_format._tokens import RenderedTokens, render_tokens

__all__ = [
    "CHAT_TEMPLATE",
    "FORMAT_TOKENS",
    "ParsedToolCall",
    "ParsedTurn",
    "RenderedTokens",
    "THINK_CLOSE",
    "THINK_OPEN",
    "chat_template_path",
    "generation_prompt",
    "parse",
    "render",
    "render_completion",
    "render_tokens",
]
