"""Teacher-forced answers: would greedy decoding write a record's gold answer, token by token?

For the base corpus's in-context lookup items (`data._lookup`: a repeated line, a table's
cell, a listed function's name, a viewer's handle), every answer is copied from the prompt, so
this measures copying on the kind of text the agent copies (names, codes, handles), where the
random-token probe (`copy_score`, drawn from the whole vocabulary) asks more than a miniature
whose rare tokens are untrained can give. A record is `{"messages": [user, assistant],
"answer", "kind"?}`; the answer's tokens are found by character offsets in the rendered row,
and each is predicted from the gold prefix (the assistant's reasoning included).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax import chat_format
from hat_jax.eval._decisions import model_greedy_fn, token_offsets


def _answer_positions(record: Mapping[str, Any], tokenizer: Any) -> tuple[np.ndarray, list[int]]:
    """The row's ids and the token indices of the answer inside the assistant's content."""
    messages = record["messages"]
    answer = record["answer"]
    if (
        not answer
        or messages[-1].get("role") != "assistant"
        or answer not in messages[-1].get("content", "")
    ):
        raise ValueError(f"{record.get('id', '?')}: the last message is no assistant reply "
                         "holding the record's answer")  # fmt: skip
    rendered = chat_format.render_tokens(messages, tokenizer)
    offsets = token_offsets(rendered, tokenizer, record.get("id", "?"))
    content = messages[-1]["content"]
    reply_end = rendered.text.rindex(content) + len(content)
    start = rendered.text.rindex(answer, 0, reply_end)
    end = start + len(answer)
    positions = [i for i, (s, e) in enumerate(offsets)
                 if i > 0 and s < end and e > start and rendered.loss_mask[i]]  # fmt: skip
    return np.asarray(rendered.ids, dtype=np.int32), positions


def answer_score(
    greedy_fn: Callable[[np.ndarray], Any], records: Sequence[Mapping[str, Any]], tokenizer: Any
) -> dict[str, Any]:
    """Teacher-forced answers of `records` (one row each).

    Returns:
      `{"exact", "tokens", "records", "kinds": {kind: exact}}`: the share of records whose every
      answer token the policy's argmax predicts, the share of answer tokens predicted, the
      records scored, and `exact` per `kind` (records without one count as "answer").

    Raises:
      ValueError: no records, or a record whose last message does not hold its answer.
    """
    if not records:
        raise ValueError("answer_score: no records")
    exact: dict[str, list[bool]] = defaultdict(list)
    right = total = 0
    for record in records:
        ids, positions = _answer_positions(record, tokenizer)
        predicted = np.asarray(greedy_fn(ids[None]))[0]
        ok = predicted[np.asarray(positions) - 1] == ids[positions]
        exact[record.get("kind", "answer")].append(bool(ok.all()))
        right, total = right + int(ok.sum()), total + len(positions)
    flat = [x for v in exact.values() for x in v]
    return {
        "exact": float(np.mean(flat)),
        "tokens": right / max(total, 1),
        "records": len(flat),
        "kinds": {k: float(np.mean(v)) for k, v in sorted(exact.items())},
    }


def answer_evaluation(
    records: Sequence[Mapping[str, Any]], tokenizer: Any
) -> Callable[[Any], dict[str, float]]:
    """`model -> {"lookup", "lookup_tokens"}` for a training stage's evaluations: the exact
    and per-token scores of `answer_score` on the same records at every evaluation."""
    records = list(records)
    for record in records:  # bad records fail here, not at the first evaluation
        _answer_positions(record, tokenizer)

    def evaluate(model: Any) -> dict[str, float]:
        score = answer_score(model_greedy_fn(model), records, tokenizer)
        return {"lookup": score["exact"], "lookup_tokens": score["tokens"]}

    return evaluate
