"""The in-context copying probe: rows, scoring with scripted policies, the model wrapper."""

import numpy as np
import pytest

from hat_jax import eval as hev
from hat_jax.eval import _copying


def _copier(ids: np.ndarray) -> np.ndarray:
    """A perfect copier of rows that repeat with period `T // 2`: predicts the token that
    followed the current position one period earlier (0 in the first copy)."""
    period = ids.shape[1] // 2
    out = np.zeros_like(ids)
    out[:, period:-1] = ids[:, 1:period]
    return out


def test_rows_repeat_their_first_half_and_follow_the_seed():
    rows = _copying.copy_rows(np.arange(10, 60), length=16, samples=3, seed=7)
    assert rows.shape == (3, 32) and rows.dtype == np.int32
    np.testing.assert_array_equal(rows[:, :16], rows[:, 16:])
    assert rows.min() >= 10 and rows.max() < 60
    np.testing.assert_array_equal(rows, _copying.copy_rows(np.arange(10, 60), length=16,
                                                           samples=3, seed=7))  # fmt: skip
    assert not np.array_equal(rows, _copying.copy_rows(np.arange(10, 60), length=16,
                                                       samples=3, seed=8))  # fmt: skip


def test_a_copier_scores_one_and_a_constant_guess_about_chance():
    ids = np.arange(1000, 1100)
    rows = _copying.copy_rows(ids, length=32, samples=4, seed=0)
    assert (_copier(rows)[:, 32:-1] == rows[:, 33:]).all()
    score = hev.copy_score(_copier, ids, length=32, samples=4, seed=0)
    assert score["tokens"] == 4 * 31 and score["chance"] == pytest.approx(0.01)
    assert score["accuracy"] == 1.0
    constant = hev.copy_score(lambda x: np.full_like(x, 1000), ids, length=32, samples=4)
    assert constant["accuracy"] < 0.1
    shifted = hev.copy_score(lambda x: np.roll(_copier(x), 1, axis=1), ids, length=32, samples=4)
    assert shifted["accuracy"] < 0.1  # off by one position is wrong everywhere


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="length=1 must be >= 2"):
        _copying.copy_rows(np.arange(10), length=1, samples=1, seed=0)
    with pytest.raises(ValueError, match="samples=0 must be >= 1"):
        _copying.copy_rows(np.arange(10), length=4, samples=0, seed=0)
    with pytest.raises(ValueError, match="at least 2 token ids"):
        _copying.copy_rows([5], length=4, samples=1, seed=0)
    with pytest.raises(ValueError, match="expected \\(2, 8\\)"):
        hev.copy_score(lambda x: x[:, :-1], np.arange(10), length=4, samples=2)


def test_ordinary_ids_leave_out_the_chat_markup():
    from data.tokenizer import load_tokenizer
    from hat_jax import chat_format

    tokenizer = load_tokenizer()
    ids = set(hev.ordinary_token_ids(tokenizer).tolist())
    for token in chat_format.FORMAT_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) not in ids
    assert len(ids) > 1000 and max(ids) < tokenizer.vocab_size


def test_the_evaluation_runs_a_model():
    from flax import nnx

    import models
    from data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    config = models.QwenConfig.preset("tiny").replace(vocab_size=len(tokenizer))
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    figures = hev.copy_evaluation(tokenizer, length=8, samples=2)(model)
    assert set(figures) == {"copy"} and 0.0 <= figures["copy"] <= 1.0
    with pytest.raises(ValueError, match="samples=0"):
        hev.copy_evaluation(tokenizer, samples=0)
