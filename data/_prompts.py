"""Instructions to prompt rows for on-policy distillation (the sampler continues them).

A prompt is the instruction's conversation rendered with the generation prompt; every token
is prompt (nothing is trained on it directly: OPD learns on the student's own samples). A
prompt longer than `max_prompt_len` is dropped and counted, never cut: a cut instruction is a
different instruction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from data._examples import Prepared
from data._instructions import Instruction
from hat_jax import chat_format


class PreparePrompt:
    """`(index, Instruction)` -> `(location, Prepared)` with one padded prompt row."""

    def __init__(self, tokenizer: Any, *, max_prompt_len: int, pad: int, enable_thinking: bool):
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be positive, got {max_prompt_len}")
        self.tokenizer, self.max_len, self.pad = tokenizer, max_prompt_len, pad
        self.enable_thinking = enable_thinking

    def __call__(self, index: int, item: tuple[int, Instruction]) -> tuple[str, Prepared]:
        source_index, instruction = item
        out = Prepared(record_id=instruction.id)
        try:
            rendered = chat_format.render_tokens(
                list(instruction.messages),
                self.tokenizer,
                add_generation_prompt=True,
                enable_thinking=self.enable_thinking,
            )
        except (ValueError, TypeError, KeyError) as err:
            return f"instruction {source_index}", Prepared(
                record_id=instruction.id, status="bad", reason=f"{type(err).__name__}: {err}"
            )
        n = len(rendered.ids)
        if n > self.max_len:
            out.too_long, out.status = 1, "empty"
            out.reason = f"prompt of {n} tokens exceeds max_prompt_len {self.max_len}"
            return f"instruction {source_index}", out
        ids = np.full(self.max_len, self.pad, np.int32)
        ids[:n] = rendered.ids
        out.rows.append(
            {
                "prompt_ids": ids,
                "prompt_lengths": np.int32(n),
                "index": np.int32(source_index),
            }
        )
        return f"instruction {source_index}", out
