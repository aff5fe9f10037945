"""Bare renders (`RenderOptions.bare_probability`): a record of the original Harness state
trained without its system prompt and tool schemas. The trained tokens are the whole render's,
only the prompt around them is shorter; other records always render whole; the draws are
seeded and counted."""

import json

import numpy as np
import pytest

import data
from data._examples import record_conversation
from hat_jax import chat_format


def _prepare(record, tokenizer, rng=0, **options):
    return data.prepare(
        json.dumps(record),
        record_id="x",
        tokenizer=tokenizer,
        options=data.RenderOptions(seq_len=16384, **options),
        rng=None if rng is None else np.random.default_rng(rng),
    )


def _targets(row):
    return row["input_ids"][row["loss_mask"] == 1]


def test_a_bare_render_trains_the_same_tokens_on_the_comment_alone(rule_records, tokenizer):
    for record in rule_records[:4]:
        assert record["state"]["kind"] == "original"
        whole = _prepare(record, tokenizer)
        bare = _prepare(record, tokenizer, bare_probability=1.0)
        assert bare.bare and not whole.bare and bare.status == whole.status == "ok"
        assert len(bare.rows) == len(whole.rows)
        for b, w in zip(bare.rows, whole.rows, strict=True):
            np.testing.assert_array_equal(_targets(b), _targets(w))
            assert len(b["input_ids"]) < len(w["input_ids"]) // 2  # the Harness was most of it
        # exactly the chat template's render of the messages without the system turn or tools
        conv = record_conversation(record, "x")
        kw = dict(enable_thinking=True, preserve_thinking=False)
        rows = data.split_rows(data.bare_conversation(conv), **kw)
        expected = chat_format.render_tokens(rows[0].messages, tokenizer, None, **kw)
        np.testing.assert_array_equal(bare.rows[0]["input_ids"], expected.ids)
        np.testing.assert_array_equal(bare.rows[0]["loss_mask"], expected.loss_mask)
        assert not any(m["role"] == "system" for m in rows[0].messages)


def test_only_records_of_the_original_state_render_bare(rule_records, tokenizer):
    record = rule_records[0]
    augmented = {**record, "state": {**record["state"], "kind": "augmented"}}
    stateless = {k: v for k, v in record.items() if k != "state"}
    for other in (augmented, stateless):
        out = _prepare(other, tokenizer, bare_probability=1.0)
        whole = _prepare(other, tokenizer)
        assert not out.bare
        np.testing.assert_array_equal(out.rows[0]["input_ids"], whole.rows[0]["input_ids"])
    # without a random generator nothing is drawn: whole
    assert not _prepare(record, tokenizer, rng=None, bare_probability=1.0).bare
    with pytest.raises(ValueError, match="bare_probability"):
        data.RenderOptions(seq_len=64, bare_probability=1.5)
    with pytest.raises(ValueError, match="leaves no message"):
        data.bare_conversation(data.Conversation(id="s", messages=[{"role": "system",
                                                                   "content": "x"}]))  # fmt: skip


def test_the_pipeline_draws_bare_renders_seeded_and_counts_them(corpus_file, tokenizer):
    def make(seed=0, **bare):
        config = data.PipelineConfig(sources=(str(corpus_file),), seq_len=16384,
                                     global_batch_size=1, seed=seed, shuffle=False, **bare)  # fmt: skip
        return data.sft_data(config, tokenizer=tokenizer, process_index=0, process_count=1)

    n = 6
    plain, every = make(), make(bare_probability=1.0)
    a, b, other = (
        make(bare_probability=0.5),
        make(bare_probability=0.5),
        make(1, bare_probability=0.5),
    )
    rows = {name: [next(it)["input_ids"] for _ in range(n)]
            for name, it in dict(plain=plain, every=every, a=a, b=b, other=other).items()}  # fmt: skip
    assert all(np.array_equal(x, y) for x, y in zip(rows["a"], rows["b"], strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(rows["a"], rows["other"], strict=True))
    stats = {name: it.stats() for name, it in dict(plain=plain, every=every, a=a).items()}
    assert stats["plain"]["bare"] == 0
    assert stats["every"]["bare"] == stats["every"]["records"] > 0
    assert 0 < stats["a"]["bare"] < stats["a"]["records"]
    per_record = {k: v["tokens"] / v["records"] for k, v in stats.items()}
    assert per_record["every"] < per_record["a"] < per_record["plain"]
    assert per_record["every"] < per_record["plain"] / 2
