"""Teacher-forced answers (`hat_jax.eval.answer_score`) on the base corpus's lookup items:
scripted policies that know the answer, know everything but the answer, or know nothing; the
answer's tokens found by offsets; bad records named; the stage evaluation on a tiny model."""

import numpy as np
import pytest

from data import _lookup
from data.tokenizer import load_tokenizer
from hat_jax import chat_format
from hat_jax import eval as hev
from hat_jax.eval import _answers


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def items():
    return _lookup.generate("dev", 8, seed=0)


def _oracle(tokenizer, records, *, wrong_answer: bool = False):
    """A policy that predicts every next token of the gold rows (or all but the answer's)."""
    rows = {}
    for r in records:
        ids, positions = _answers._answer_positions(r, tokenizer)
        rows[ids.tobytes()] = (ids, positions)

    def greedy(batch):
        ids, positions = rows[batch[0].astype(np.int32).tobytes()]
        out = np.zeros_like(batch)
        out[0, :-1] = ids[1:]
        if wrong_answer:
            out[0, np.asarray(positions) - 1] = -1
        return out

    return greedy


def test_the_answer_tokens_are_the_answer(tokenizer, items):
    for r in items:
        ids, positions = _answers._answer_positions(r, tokenizer)
        assert positions == list(range(positions[0], positions[-1] + 1))  # one stretch
        assert tokenizer.decode(ids[positions]).strip() == r["answer"]
        rendered = chat_format.render_tokens(r["messages"], tokenizer)
        assert all(rendered.loss_mask[p] for p in positions)


def test_scripted_policies(tokenizer, items):
    perfect = hev.answer_score(_oracle(tokenizer, items), items, tokenizer)
    assert perfect["exact"] == 1.0 and perfect["tokens"] == 1.0 and perfect["records"] == 8
    assert set(perfect["kinds"]) == set(_lookup.KINDS)
    wrong = hev.answer_score(_oracle(tokenizer, items, wrong_answer=True), items, tokenizer)
    assert wrong["exact"] == 0.0 and wrong["tokens"] == 0.0  # the format alone counts nothing
    nothing = hev.answer_score(lambda x: np.zeros_like(x), items, tokenizer)
    assert nothing["exact"] == 0.0


def test_bad_records_are_named(tokenizer, items):
    with pytest.raises(ValueError, match="no records"):
        hev.answer_score(lambda x: x, [], tokenizer)
    bad = {**items[0], "id": "x-1", "answer": "not in the reply"}
    with pytest.raises(ValueError, match="x-1: the last message is no assistant reply"):
        hev.answer_evaluation([bad], tokenizer)


def test_the_evaluation_runs_a_model(tokenizer, items):
    from flax import nnx

    import models

    config = models.QwenConfig.preset("tiny_attention").replace(vocab_size=len(tokenizer))
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    figures = hev.answer_evaluation(items[:2], tokenizer)(model)
    assert set(figures) == {"lookup", "lookup_tokens"}
    assert figures["lookup"] == 0.0 and 0.0 <= figures["lookup_tokens"] < 0.5  # random weights
