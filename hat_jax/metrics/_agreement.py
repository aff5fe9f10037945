"""Agreement between two raters on a fixed label scale: the confusion matrix and Cohen's kappa
(shared by the RL judge panel's agreement with the rule rewards and by evaluation's judge
calibration against human labels)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion_matrix(pairs: Sequence[tuple[float, float]], scale: Sequence[float]) -> np.ndarray:
    """Counts of (first, second) label pairs; rows are the first rater's label, columns the
    second's, both in `scale` order."""
    index = {x: i for i, x in enumerate(scale)}
    matrix = np.zeros((len(scale), len(scale)), dtype=np.int64)
    for first, second in pairs:
        matrix[index[first], index[second]] += 1
    return matrix


def cohen_kappa(matrix: np.ndarray) -> float | None:
    """Cohen's kappa of a square confusion matrix.

    Returns None when it is undefined: no pairs, or both raters always gave the same single
    label (chance agreement 1).
    """
    m = np.asarray(matrix, dtype=np.float64)
    n = m.sum()
    if n == 0:
        return None
    observed = np.trace(m) / n
    expected = float(m.sum(axis=1) @ m.sum(axis=0)) / (n * n)
    if expected >= 1.0:
        return None
    return float((observed - expected) / (1.0 - expected))
