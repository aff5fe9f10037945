"""Rewriters: where HSA gets new wording and new names.

A `Rewriter` answers two questions: "give me another way to say this text" and "which other
names could this Skill or tool have". `BankRewriter` answers from the bundled, reviewed bank
(offline, deterministic in the random generator it is handed); `LLMRewriter` (in `_llm.py`)
asks an OpenAI-compatible model and falls back to a bank. Augmentation code never cares
which one it has.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from hat_jax.hsa._bank import Bank, default_bank, normalize

TEXT_KINDS = (
    "skill.description",
    "skill.intro",
    "skill.rule",
    "tool.description",
    "tool.parameter",
    "prompt.item",
    "hook.message",
)
NAME_KINDS = ("skill", "tool")


@runtime_checkable
class Rewriter(Protocol):
    """Source of paraphrases and alternative names for Harness-State Augmentation."""

    def rewrite(self, kind: str, text: str, rng: random.Random) -> str:
        """A paraphrase of `text` (one of `TEXT_KINDS`), or `text` itself when none is known.

        A paraphrase must keep every placeholder and format field of `text` exactly.
        """
        ...

    def names(self, kind: str, canonical: str) -> Sequence[str]:
        """Alternative names for the Skill or tool `canonical` (`kind` is "skill" or "tool")."""
        ...


class BankRewriter:
    """Offline rewriting from a reviewed bank (default: the bundled one).

    Deterministic: the choice among a text's paraphrases is made with the `rng` passed in.
    Texts the bank does not know (e.g. a Skill an operator just edited) come back unchanged.
    """

    def __init__(self, bank: Bank | None = None):
        self.bank = bank or default_bank()

    def rewrite(self, kind: str, text: str, rng: random.Random) -> str:
        if kind not in TEXT_KINDS:
            raise ValueError(f"unknown text kind {kind!r}; expected one of {TEXT_KINDS}")
        options = self.bank.paraphrases(kind, text)
        return rng.choice(options) if options else normalize(text)

    def names(self, kind: str, canonical: str) -> Sequence[str]:
        if kind not in NAME_KINDS:
            raise ValueError(f"unknown name kind {kind!r}; expected one of {NAME_KINDS}")
        return self.bank.names.get((kind, canonical), ())
