"""In-context copying: can a policy repeat what its context already holds?

The agent task is mostly copying from the prompt: the tool names of the (possibly renamed)
tool list, the product's name and id, the viewer's handle, the facts a tool returned. A
pretrained model does this from its first step; a model trained from random weights on a few
million tokens may not, and then no amount of SFT on the agent's conversations teaches the task
(its predictions at a tool name are the same in every conversation). This probe measures the
ability directly, as the induction score of the interpretability literature: sequences of
random ordinary tokens, each shown twice in one row; the score is the fraction of the second
copy's tokens (after its first, which nothing predicts) that the policy's argmax predicts.
Chance is about 1 / the number of tokens drawn from; a model that copies scores near 1.

The policy is a `greedy_fn(ids: int32[B, T]) -> int[B, T]` (`model_greedy_fn` wraps a model).
The SFT stage logs it with its eval loss (`eval/copy`) when `data.copy_probe_samples` > 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def ordinary_token_ids(tokenizer: Any) -> np.ndarray:
    """The ids of the tokenizer's own vocabulary: special and added tokens (the chat markup)
    left out, so a probe row is plain text to the model."""
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [i for i in range(int(tokenizer.vocab_size)) if i not in added and i not in special]
    return np.asarray(ids, dtype=np.int32)


def copy_rows(
    token_ids: Sequence[int] | np.ndarray, *, length: int, samples: int, seed: int
) -> np.ndarray:
    """`int32[samples, 2 * length]`: random tokens drawn from `token_ids`, each row's first
    half repeated as its second half. A seed gives the same rows on every machine.

    Raises:
      ValueError: `length` < 2, `samples` < 1, or fewer than 2 token ids to draw from.
    """
    token_ids = np.asarray(token_ids, dtype=np.int32)
    if length < 2:
        raise ValueError(f"copy probe: length={length} must be >= 2")
    if samples < 1:
        raise ValueError(f"copy probe: samples={samples} must be >= 1")
    if token_ids.ndim != 1 or token_ids.size < 2:
        raise ValueError(f"copy probe: needs at least 2 token ids, got {token_ids.size}")
    rng = np.random.default_rng(seed)
    first = token_ids[rng.integers(0, token_ids.size, size=(samples, length))]
    return np.concatenate([first, first], axis=1)


def copy_score(
    greedy_fn: Callable[[np.ndarray], Any],
    token_ids: Sequence[int] | np.ndarray,
    *,
    length: int = 128,
    samples: int = 8,
    seed: int = 0,
) -> dict[str, float]:
    """The policy's in-context copying on `samples` rows of `length` random tokens shown twice.

    Returns:
      `{"accuracy", "tokens", "chance"}`: the fraction of predicted tokens of the second copies
      (`samples * (length - 1)` of them) and the score of a policy that guesses uniformly.
    """
    rows = copy_rows(token_ids, length=length, samples=samples, seed=seed)
    return _score_rows(greedy_fn, rows) | {"chance": 1.0 / np.unique(token_ids).size}


def _score_rows(greedy_fn: Callable[[np.ndarray], Any], rows: np.ndarray) -> dict[str, float]:
    """`{"accuracy", "tokens"}` of the policy on `copy_rows` output (period `T // 2`)."""
    length = rows.shape[1] // 2
    predicted = np.asarray(greedy_fn(rows))  # [:, i]: the guess for token i + 1
    if predicted.shape != rows.shape:
        raise ValueError(f"greedy_fn returned shape {predicted.shape}, expected {rows.shape}")
    # the second copy's tokens after its first: positions length + 1 .. 2 * length - 1
    right = predicted[:, length:-1] == rows[:, length + 1 :]
    return {"accuracy": float(right.mean()), "tokens": int(right.size)}


def copy_evaluation(
    tokenizer: Any, *, length: int = 128, samples: int = 8, seed: int = 0
) -> Callable[[Any], dict[str, float]]:
    """`model -> {"copy": accuracy}` for a training stage's evaluations (the same rows at every
    evaluation, drawn from the tokenizer's ordinary tokens)."""
    from hat_jax.eval._decisions import model_greedy_fn

    # drawn once (bad arguments fail here, not at the first evaluation)
    rows = copy_rows(ordinary_token_ids(tokenizer), length=length, samples=samples, seed=seed)

    def evaluate(model: Any) -> dict[str, float]:
        return {"copy": _score_rows(model_greedy_fn(model), rows)["accuracy"]}

    return evaluate
