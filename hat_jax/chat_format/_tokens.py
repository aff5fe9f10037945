"""Conversations to token ids with a per-token loss mask, exactly as the tokenizer sees the text.

Token-in/token-out: the ids are the tokenizer's encoding of the whole rendered text (what
`tokenizer(render(...), add_special_tokens=False)` returns). The mask is read off the character
offsets of each token: a token is trainable (1) when any of its characters was written by the
assistant — its reasoning, `</think>`, content, tool-call XML and the closing `<|im_end|>`.
Headers a generation prompt supplies (`<|im_start|>assistant\\n`, and the opened or empty think
block), the newline after `<|im_end|>`, and every system, user and tool token are 0.

In the Qwen format every such boundary falls at an added token or at a pre-tokenizer split, so
no token straddles it, with one exception: a turn with empty reasoning under thinking renders
`<think>\\n\\n</think>`, and Qwen's pre-tokenizer keeps `\\n\\n` together, so that one token
covers the prompt's newline and the model's; it counts as the model's (1), as the model must
predict it.

Speed without drift: a tokenizer extracts its added tokens before normalising and
pre-tokenising, so the text between two format tokens (`<|im_start|>`, `<think>`, ...) is
encoded independently of its neighbours. When the tokenizer's format tokens are plain added
tokens (no lstrip/rstrip/single_word, not normalised, not inside a longer added token), the
text is therefore encoded segment by segment and each segment's encoding is cached: the long
system turn (tool schemas, Skills, rules) that many conversations share is encoded once. Any
other tokenizer gets one encoding of the whole text. Either way the ids equal the full-text
encoding (tests check both paths). The cache assumes a tokenizer is not reconfigured in place
(its normaliser or pre-tokenizer swapped) after use; adding tokens is detected.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers

from hat_jax.chat_format import _format as fmt
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
    ids, mask = _ids_and_mask(_encode(tokenizer, text), _trainable_spans(pieces))
    return RenderedTokens(ids=ids, loss_mask=mask, text=text)


# An encoded stretch of the text: (start, end, token ids, offsets relative to start).
_Chunk = tuple[int, int, list[int], list[tuple[int, int]]]


def _encode(tokenizer: Any, text: str) -> list[_Chunk]:
    """The encoding of `text` (no added BOS/EOS) as consecutive chunks."""
    if isinstance(tokenizer, tokenizers.Tokenizer):
        if tokenizer.padding or tokenizer.truncation:
            raise ValueError("render_tokens: switch padding and truncation off on the tokenizer")
        return _segment_encoder(tokenizer).encode(text)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not (backend.padding or backend.truncation):
        return _segment_encoder(backend).encode(text)
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError(
            f"render_tokens needs a fast (Rust-backed) tokenizer for character offsets; "
            f"got {type(tokenizer).__name__}"
        )
    # transformers switches the backend's padding/truncation off for this one call.
    out = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [(0, len(text), list(out["input_ids"]), [tuple(o) for o in out["offset_mapping"]])]


class _SegmentEncoder:
    """Encodes text split at the format's added tokens, caching each segment's encoding."""

    def __init__(self, backend: tokenizers.Tokenizer, cache_size: int = 4096):
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.token_ids = _plain_format_token_ids(backend)
        self.cache: collections.OrderedDict[str, tuple[list[int], list[tuple[int, int]]]] = (
            collections.OrderedDict()
        )
        self.cache_size = cache_size
        self.lock = threading.Lock()

    def encode(self, text: str) -> list[_Chunk]:
        if self.token_ids is None:
            encoding = self.backend.encode(text, add_special_tokens=False)
            return [(0, len(text), list(encoding.ids), list(encoding.offsets))]
        chunks: list[_Chunk] = []
        pos = 0
        for piece in _FORMAT_SPLIT.split(text):
            if not piece:
                continue
            end = pos + len(piece)
            if piece in self.token_ids:
                chunks.append((pos, end, [self.token_ids[piece]], [(0, len(piece))]))
            else:
                chunks.append((pos, end, *self._segment(piece)))
            pos = end
        return chunks

    def _segment(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        with self.lock:
            hit = self.cache.get(text)
            if hit is not None:
                self.cache.move_to_end(text)
                return hit
        encoding = self.backend.encode(text, add_special_tokens=False)
        hit = (list(encoding.ids), list(encoding.offsets))
        with self.lock:
            self.cache[text] = hit
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return hit


_FORMAT_SPLIT = re.compile(
    "(" + "|".join(re.escape(t) for t in sorted(fmt.FORMAT_TOKENS, key=len, reverse=True)) + ")"
)
_ENCODERS: dict[int, _SegmentEncoder] = {}  # by id(backend); holds the backend, so ids stay unique


_ENCODERS_LOCK = threading.Lock()


def _segment_encoder(backend: tokenizers.Tokenizer) -> _SegmentEncoder:
    with _ENCODERS_LOCK:
        encoder = _ENCODERS.get(id(backend))
        size = backend.get_vocab_size(with_added_tokens=True)
        if encoder is None or encoder.backend is not backend or encoder.vocab_size != size:
            if len(_ENCODERS) >= 8:
                _ENCODERS.pop(next(iter(_ENCODERS)))
            encoder = _ENCODERS[id(backend)] = _SegmentEncoder(backend)
        return encoder


def _plain_format_token_ids(backend: tokenizers.Tokenizer) -> dict[str, int] | None:
    """Format token -> id when every format token is a plain added token; else None.

    Plain: matched verbatim, not normalised, without lstrip/rstrip/single_word, and not part of a
    longer added token (which the tokenizer would match instead). Only then is encoding the
    segments between them the same as encoding the whole text.
    """
    added = backend.get_added_tokens_decoder()
    by_content = {token.content: (i, token) for i, token in added.items()}
    ids = {}
    for content in fmt.FORMAT_TOKENS:
        if content not in by_content:
            return None
        i, token = by_content[content]
        if token.lstrip or token.rstrip or token.single_word or token.normalized:
            return None
        ids[content] = i
    for other in by_content:
        if other not in ids and any(t in other for t in fmt.FORMAT_TOKENS):
            return None
    return ids


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


def _ids_and_mask(
    chunks: list[_Chunk], spans: list[tuple[int, int]]
) -> tuple[list[int], list[int]]:
    """Concatenated ids, and 1 for each token whose characters overlap a trainable span.

    A chunk wholly inside one span or outside all of them is filled at once; only chunks that
    straddle a span edge (e.g. `assistant\\n` + the reply) are looked at token by token.
    """
    ids: list[int] = []
    mask: list[int] = []
    k = 0
    for start, end, chunk_ids, offsets in chunks:
        ids.extend(chunk_ids)
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        if k == len(spans) or spans[k][0] >= end:
            mask.extend([0] * len(chunk_ids))
        elif spans[k][0] <= start and end <= spans[k][1]:
            mask.extend([1] * len(chunk_ids))
        else:
            mask.extend(_token_mask([(start + a, start + b) for a, b in offsets], spans[k:]))
    return ids, mask


def _token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Per token: 1 if it overlaps a span (a zero-width token: if a span contains its start).

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
