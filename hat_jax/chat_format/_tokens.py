"""Conversations to token ids with a per-token loss mask, exactly as the tokenizer sees the text.

Token-in/token-out: the ids are the tokenizer's encoding of the whole rendered text (what
`tokenizer(render(...), add_special_tokens=False)` returns), never a concatenation of
separately tokenized pieces, so no merge can drift across a piece boundary. The mask is then
read off the character offsets of each token: a token is trainable (1) when any of its
characters was written by the assistant — its reasoning, `</think>`, content, tool-call XML and
the closing `<|im_end|>`. Headers a generation prompt supplies (`<|im_start|>assistant\\n`, and
the opened or empty think block), the newline after `<|im_end|>`, and every system, user and
tool token are 0.

In the Qwen format every such boundary falls at an added token or at a pre-tokenizer split, so
no token straddles it, with one exception: a turn with empty reasoning under thinking renders
`<think>\\n\\n</think>`, and Qwen's pre-tokenizer keeps `\\n\\n` together, so that one token
covers the prompt's newline and the model's; it counts as the model's (1), as the model must
predict it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers

from hat_jax.chat_format import _render


@dataclasses.dataclass(frozen=True)
class RenderedTokens:
    """A tokenized conversation.

    Attributes:
      ids: token ids of the rendered text.
      loss_mask: 1 on tokens the assistant produced, 0 elsewhere; same length as `ids`.
      text: the rendered text the ids encode.
    """

    ids: list[int]
    loss_mask: list[int]
    text: str = ""

    def __post_init__(self):
        if len(self.ids) != len(self.loss_mask):
            raise ValueError(f"ids ({len(self.ids)}) and loss_mask ({len(self.loss_mask)}) differ")


def render_tokens(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    enable_thinking: bool = True,
    add_generation_prompt: bool = False,
    preserve_thinking: bool = False,
) -> RenderedTokens:
    """Renders a conversation and tokenizes it with a loss mask on the assistant's tokens.

    Args:
      messages: OpenAI-style message dicts; an assistant message with `"weight": 0` is rendered
        but masked out (e.g. a failed attempt kept for context).
      tokenizer: a `transformers` fast tokenizer or a `tokenizers.Tokenizer`.
      tools: OpenAI function schemas, or None.
      enable_thinking: the thinking mode the assistant turns were generated under; it decides
        which header tokens a generation prompt supplied (and so are 0).
      add_generation_prompt: append the generation prompt (all 0), for sampling.
      preserve_thinking: keep reasoning on every assistant turn (see `render`).

    Returns:
      `RenderedTokens` whose `ids` equal `tokenizer(text, add_special_tokens=False)` ids.
    """
    pieces = _render.render_pieces(
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        preserve_thinking=preserve_thinking,
    )
    text = "".join(piece for piece, _ in pieces)
    ids, offsets = _encode(tokenizer, text)
    return RenderedTokens(ids=ids, loss_mask=_mask(offsets, _trainable_spans(pieces)), text=text)


def _encode(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of `text`, without added BOS/EOS."""
    backend = tokenizer if isinstance(tokenizer, tokenizers.Tokenizer) else None
    if backend is None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and (backend.padding or backend.truncation):
            backend = None  # let transformers switch padding/truncation off for this call
    if backend is not None:
        encoding = backend.encode(text, add_special_tokens=False)
        return list(encoding.ids), list(encoding.offsets)
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"render_tokens needs a fast (Rust-backed) tokenizer for character offsets; "
            f"got {type(tokenizer).__name__}"
        )
    out = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(out["input_ids"]), [tuple(o) for o in out["offset_mapping"]]


def _trainable_spans(pieces: list[_render.Piece]) -> list[tuple[int, int]]:
    """Character spans [start, end) of trainable pieces, adjacent ones merged."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for text, trainable in pieces:
        end = pos + len(text)
        if trainable and end > pos:
            if spans and spans[-1][1] == pos:
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((pos, end))
        pos = end
    return spans


def _mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters overlap a span (a zero-width token: contains its start).

    Offsets and spans are both sorted, so one pass over the tokens suffices.
    """
    mask = [0] * len(offsets)
    k = 0
    for t, (start, end) in enumerate(offsets):
        end = max(end, start + 1)
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[t] = 1
    return mask
