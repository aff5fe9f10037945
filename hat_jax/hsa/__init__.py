"""Harness-State Augmentation (HSA): task-preserving variation of the Harness (paper §3.2).

    from hat_jax import harness as hx, hsa, livestream
    base = hx.load(livestream.default_world_dir())
    state = hsa.augment(base, seed=7)                               # all five dimensions
    state = hsa.augment(base, seed=7, dims={hsa.Dim.TOOL_DEF}, strength=0.8)
    state = hsa.augment(base, seed=7, preserve=hsa.Preserve(skills={"product-qa"}, min_rounds=3))
    state.harness, state.renames                                    # variant + surface->canonical

Five dimensions, each switchable alone: Skill identifiers (rename, rewrite descriptions, add
plausible and noise Skills, mask Skills the task does not need, reorder the index), Skill
content (paraphrase, mask non-critical rules, reorder), tool definitions (rename, rewrite
descriptions, reorder parameters; function preserved), the system prompt (reorder blocks and
items, paraphrase, move numeric constraints within their valid ranges) and Hooks (retry
behaviour, message wording and structure, input processing, fallback).

The variant drives both sides consistently: the policy sees only surface names, executors and
rewards resolve them through the `RenameMap`, so a renamed tool called by its old name is an
unknown tool. Rewriting is offline by default (`BankRewriter` over the bundled, reviewed bank
in `hat_jax/hsa/bank/`); `LLMRewriter` uses any OpenAI-compatible model with an on-disk cache.
"""

from hat_jax.hsa._augment import ALL, Dim, HsaError, augment, parse_dims
from hat_jax.hsa._bank import BANK_DIR, Bank, BankError, SyntheticSkill, default_bank, load_bank
from hat_jax.hsa._ctx import Preserve
from hat_jax.hsa._diff import changes
from hat_jax.hsa._hooks import FLIPPABLE
from hat_jax.hsa._llm import LLMRewriter
from hat_jax.hsa._rename import rename_all
from hat_jax.hsa._rewrite import NAME_KINDS, TEXT_KINDS, BankRewriter, Rewriter
from hat_jax.hsa._skills import link_mentions
from hat_jax.hsa._surface import PreserveError

__all__ = [
    "ALL",
    "BANK_DIR",
    "FLIPPABLE",
    "NAME_KINDS",
    "TEXT_KINDS",
    "Bank",
    "BankError",
    "BankRewriter",
    "Dim",
    "HsaError",
    "LLMRewriter",
    "Preserve",
    "PreserveError",
    "Rewriter",
    "SyntheticSkill",
    "augment",
    "changes",
    "default_bank",
    "link_mentions",
    "load_bank",
    "parse_dims",
    "rename_all",
]
