"""The learned injection detector: a second line behind the guardrails' lexicons.

A linear model over hashed character n-grams (1-4) of the guardrails' matching form of a text
(`_guard.fold`: NFKC, invisible characters removed, look-alikes and case folded, and whatever
script folding it applies), so it reads English, Chinese in either script and mixed text
alike. Digits are one symbol and handle separators (`_ . -` and the like) are spaces, so figures
and handles share n-grams with sentences. A text's n-grams are hashed once each (CRC-32, the
low `bits` bits), the score is the logistic of `bias + sum(weights[ids]) / sqrt(len(ids))`,
and a long text is scored by its worst window, so an instruction inside a long tool string is
not diluted. Scoring is numpy only: the model ships as an `.npz` of arrays (no pickle), trained
by `hat_jax.harness.detector_training` (scikit-learn) with its threshold set for zero false
positives on the simulator's benign comments. What the model is and what it measured is
`data/guard/detector_v3.json`.

The detector is evidence, not a guarantee: it catches phrasings near the ones it was trained
on. The structural guardrails (control syntax, taint, evidence for claims) stay the guarantee.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import re
import zlib

import numpy as np

from hat_jax.harness import _guard as guard

NGRAMS = (1, 2, 3, 4)
WINDOW, STRIDE = 256, 128  # characters of the folded text scored together
MAX_CHARS = 8192
_SEPARATORS = re.compile(r"[_.\-/|#@~+=]+")
_DIGITS = re.compile(r"\d")


def default_path() -> pathlib.Path:
    """The shipped model (`data/guard/detector_v3.npz`)."""
    return pathlib.Path(__file__).resolve().parents[2] / "data" / "guard" / "detector_v3.npz"


def feature_text(text: str) -> str:
    """The text the n-grams are taken from: the guardrails' fold, separators as spaces, every
    digit as 0, padded with a space at each end. (Camel case is not split: that would make
    the score depend on letter case, which the fold removes.)"""
    folded = guard.fold(text, MAX_CHARS)
    folded = _DIGITS.sub("0", _SEPARATORS.sub(" ", folded))
    return f" {' '.join(folded.split())} "


def _window_ids(s: str, mask: int) -> list[int]:
    grams = {s[i : i + n] for n in NGRAMS for i in range(len(s) - n + 1)}
    # Sorted, so the float sum of their weights does not depend on the set's (per-process) order.
    return sorted(zlib.crc32(g.encode()) & mask for g in grams)


def window_ids(text: str, bits: int) -> list[list[int]]:
    """Hashed n-gram ids of each window of `feature_text(text)` (one window up to `WINDOW`
    characters)."""
    s, mask = feature_text(text), (1 << bits) - 1
    if not s.strip():
        return []
    if len(s) <= WINDOW:
        return [_window_ids(s, mask)]
    starts = range(0, len(s) - WINDOW + STRIDE, STRIDE)
    return [_window_ids(s[i : i + WINDOW], mask) for i in starts]


@dataclasses.dataclass(frozen=True)
class Detector:
    """A trained linear model: `weights` f32[2**bits], `bias`, and the probability `threshold`
    at and above which a text is flagged."""

    weights: np.ndarray
    bias: float
    threshold: float

    @property
    def bits(self) -> int:
        return int(self.weights.size).bit_length() - 1

    def logit(self, text: str) -> float:
        """The largest logit over the text's windows (-inf for a text without characters)."""
        best = -math.inf
        for ids in window_ids(text, self.bits):
            if ids:
                z = float(self.weights[ids].sum()) / math.sqrt(len(ids))
                best = max(best, self.bias + z)
        return best

    def score(self, text: str) -> float:
        """The probability that `text` is an injection or manipulation attempt, in [0, 1]."""
        z = self.logit(text)
        return 0.0 if z == -math.inf else 1.0 / (1.0 + math.exp(-z))

    def flagged(self, text: str) -> bool:
        return bool(text) and self.score(text) >= self.threshold


def load(path: str | pathlib.Path) -> Detector:
    """Reads a model written by `save` (arrays only; no pickle)."""
    with np.load(path, allow_pickle=False) as z:
        weights = z["weights"].astype(np.float32)
        if weights.size & (weights.size - 1):
            raise ValueError(f"{path}: the weight vector's size {weights.size} is not 2**bits")
        return Detector(weights, float(z["bias"]), float(z["threshold"]))


def save(path: str | pathlib.Path, detector: Detector) -> None:
    """Writes `detector` as a compressed `.npz` of three arrays."""
    np.savez_compressed(
        path,
        weights=detector.weights.astype(np.float32),
        bias=np.float64(detector.bias),
        threshold=np.float64(detector.threshold),
    )


@functools.cache
def default() -> Detector:
    """The shipped model, loaded once."""
    return load(default_path())


def injection_score(text: str) -> float:
    """The shipped detector's probability that `text` (a comment, handle or tool string) tries
    to instruct the agent or manipulate what it says."""
    return default().score(text)


def flagged(text: str) -> bool:
    """Whether the shipped detector flags `text` (score at or above its shipped threshold)."""
    return default().flagged(text)
