"""The Grain SFT pipeline: the batch contract, determinism, exact mid-epoch restore, sharding,
and bad data counted instead of crashing."""

import json
import logging

import numpy as np
import pytest

import data
from hat_jax import train


def _config(path, **kw):
    kw.setdefault("seq_len", 256)
    kw.setdefault("global_batch_size", 2)
    kw.setdefault("pack_bins", 4)
    return data.PipelineConfig(sources=(str(path),), **kw)


def _iterator(path, tokenizer, process=(0, 1), **kw):
    return data.sft_data(
        _config(path, **kw), tokenizer=tokenizer, process_index=process[0], process_count=process[1]
    )


def _take(it, n):
    return [next(it) for _ in range(n)]


def _same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def _segments(batch):
    """(ids, mask, positions) of every packed segment."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        seg = batch["segment_ids"][r]
        for s in np.unique(seg[seg > 0]):
            idx = np.flatnonzero(seg == s)
            out.append(
                (
                    tuple(batch["input_ids"][r, idx]),
                    tuple(batch["loss_mask"][r, idx]),
                    batch["positions"][r, idx],
                    idx,
                )
            )
    return out


def _rows_of(path, tokenizer, seq_len=256):
    options = data.RenderOptions(seq_len=seq_len)
    rows = set()
    for line in path.read_text().splitlines():
        for row in data.prepare(line, record_id="x", tokenizer=tokenizer, options=options).rows:
            rows.add((tuple(row["input_ids"]), tuple(row["loss_mask"])))
    return rows


def test_batches_follow_the_training_contract(chat_file, tokenizer):
    it = _iterator(chat_file, tokenizer)
    rows = _rows_of(chat_file, tokenizer)
    pad = data.pad_id(tokenizer)
    assert isinstance(it, train.DataSource)
    multi = 0
    for batch in _take(it, 12):
        assert set(batch) == set(train.BATCH_KEYS)
        for k in train.BATCH_KEYS:
            assert batch[k].shape == (2, 256) and batch[k].dtype == np.int32
        seg = batch["segment_ids"]
        assert np.all(batch["input_ids"][seg == 0] == pad)
        assert np.all(batch["loss_mask"][seg == 0] == 0)
        for r in range(2):  # segments are 1, 2, ... in order, then padding
            used = seg[r][seg[r] > 0]
            assert np.all(np.diff(used) >= 0) and used[0] == 1
            assert np.all(seg[r][len(used) :] == 0)
            multi += int(used[-1] > 1)
        for ids, mask, positions, idx in _segments(batch):
            assert (ids, mask) in rows  # a segment is one whole prepared row
            np.testing.assert_array_equal(positions, np.arange(len(idx)))
            assert np.all(np.diff(idx) == 1)
    assert multi > 0  # packing did put several conversations in a row


def test_same_seed_same_batches_other_seed_other_batches(chat_file, tokenizer):
    a = _take(_iterator(chat_file, tokenizer, seed=3), 8)
    b = _take(_iterator(chat_file, tokenizer, seed=3), 8)
    c = _take(_iterator(chat_file, tokenizer, seed=4), 8)
    assert _same(a, b)
    assert not _same(a, c)


@pytest.mark.parametrize("stop", [1, 3, 5, 14])
def test_restore_mid_epoch_continues_exactly(chat_file, tokenizer, stop):
    """State after `stop` batches, through JSON, into a fresh iterator: the next batches are
    those of an uninterrupted run (14 batches cross the epoch boundary of 24 records)."""
    whole = _iterator(chat_file, tokenizer, seed=7)
    expected = _take(whole, stop + 6)
    first = _iterator(chat_file, tokenizer, seed=7)
    _take(first, stop)
    state = json.loads(json.dumps(first.get_state()))
    resumed = _iterator(chat_file, tokenizer, seed=7)
    resumed.set_state(state)
    assert _same(_take(resumed, 6), expected[stop:])
    assert resumed.stats() == whole.stats()


def test_restore_refuses_another_configuration(chat_file, tokenizer):
    it = _iterator(chat_file, tokenizer, seed=1)
    next(it)
    with pytest.raises(ValueError, match="different data config"):
        _iterator(chat_file, tokenizer, seed=2).set_state(it.get_state())
    with pytest.raises(ValueError, match="different data config"):
        _iterator(chat_file, tokenizer, seed=1, seq_len=512).set_state(it.get_state())


def _global(chat_file, tokenizer, processes, steps, state=None, **kw):
    """`steps` global batches read by `processes` processes (their rows concatenated in
    process order, as `jax.make_array_from_process_local_data` lays them out)."""
    its = [_iterator(chat_file, tokenizer, process=(p, processes), **kw) for p in range(processes)]
    for it in its:
        if state is not None:
            it.set_state(json.loads(json.dumps(state)))
    batches = [
        {k: np.concatenate([b[k] for b in parts]) for k in parts[0]}
        for parts in zip(*(_take(it, steps) for it in its), strict=True)
    ]
    return batches, [it.get_state() for it in its]


def test_the_global_batch_does_not_depend_on_the_process_count(chat_file, tokenizer):
    """Four data shards (the default for a batch of 4): 1, 2 and 4 processes read the same
    global batches, across the epoch boundary, each process a disjoint part."""
    kw = dict(global_batch_size=4, seed=3)
    one, _ = _global(chat_file, tokenizer, 1, 10, **kw)
    for processes in (2, 4):
        several, _ = _global(chat_file, tokenizer, processes, 10, **kw)
        assert _same(several, one), processes
    with pytest.raises(ValueError, match="data_shards=4 is not a multiple of the 8 processes"):
        _iterator(chat_file, tokenizer, process=(0, 8), data_shards=4, global_batch_size=8)
    with pytest.raises(ValueError, match="data_shards=3 does not divide global_batch_size 4"):
        _iterator(chat_file, tokenizer, data_shards=3, global_batch_size=4)
    with pytest.raises(ValueError, match="not divisible by 3 processes"):
        _iterator(chat_file, tokenizer, process=(0, 3), global_batch_size=4)


def test_an_epoch_reads_every_record_once_whatever_the_process_count(chat_file, tokenizer):
    """By record: one epoch over 1, 2 and 4 processes reads each of the 24 records exactly
    once, and no record in two processes (rows as long as the longest record: one per row)."""
    every = {ids for ids, _ in _rows_of(chat_file, tokenizer)}
    longest, (a, b) = max(map(len, every)), sorted(map(len, every))[:2]
    assert a + b > longest
    kw = dict(global_batch_size=4, num_epochs=1, pack_bins=1, seq_len=longest)
    for processes in (1, 2, 4):
        seen = []
        for p in range(processes):
            it = _iterator(chat_file, tokenizer, process=(p, processes), **kw)
            seen.append([s[0] for b in it for s in _segments(b)])
        flat = [s for part in seen for s in part]
        assert len(flat) == len(set(flat)) == 24, processes
        assert set(flat) == every
        assert sum(len(set(a) & set(b)) for a in seen for b in seen if a is not b) == 0


@pytest.mark.parametrize("saved, resumed", [(2, 1), (2, 4), (4, 2)])
def test_states_of_every_process_restore_into_another_process_count(
    chat_file, tokenizer, saved, resumed
):
    kw = dict(global_batch_size=4, seed=9)
    expected, _ = _global(chat_file, tokenizer, 1, 9, **kw)
    _, states = _global(chat_file, tokenizer, saved, 5, **kw)
    after, _ = _global(chat_file, tokenizer, resumed, 4, state=states, **kw)
    assert _same(after, expected[5:])
    with pytest.raises(ValueError, match=r"shards \[2, 3\] are missing"):
        _iterator(chat_file, tokenizer, **kw).set_state(states[:1] if saved == 2 else states[:2])
    with pytest.raises(ValueError, match="different data config"):
        _iterator(chat_file, tokenizer, global_batch_size=4, seed=1).set_state(states)


def test_finite_epochs_end_and_see_each_record_once(chat_file, tokenizer):
    it = _iterator(chat_file, tokenizer, num_epochs=1, global_batch_size=1, pack_bins=1)
    segs = [s[0] for b in it for s in _segments(b)]
    assert len(segs) == len(set(segs)) == it.stats()["rows"] == 24


def test_agent_rows_pack_into_long_rows(corpus_file, rule_records, tokenizer):
    it = _iterator(corpus_file, tokenizer, seq_len=16384, global_batch_size=2, pack_bins=2)
    batch = next(it)
    assert batch["segment_ids"].max() >= 2
    stats = it.stats()
    assert stats["bad"] == 0 and stats["target_tokens"] > 0
    assert 0.0 <= stats["padding_fraction"] < 0.5


def test_bad_data_is_counted_skipped_and_logged(tmp_path, chat_file, tokenizer, caplog):
    lines = chat_file.read_text().splitlines()
    lines[3] = "{this is not json"
    lines[7] = json.dumps({"id": "no-conversation", "tools": []})
    long = json.loads(lines[11])
    long["id"] = "too-long"
    long["messages"][-1]["content"] = "word " * 400
    lines[11] = json.dumps(long)
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        it = _iterator(path, tokenizer, num_epochs=1)
        batches = list(it)
    stats = it.stats()
    assert batches
    assert (stats["records"], stats["bad"], stats["empty"], stats["too_long"]) == (24, 2, 1, 1)
    assert stats["skip_reasons"] == {"JSONDecodeError": 1, "ValueError": 1, "empty": 1}
    assert "no-conversation" in caplog.text and "mixed.jsonl:record 3" in caplog.text
    assert "too-long" in caplog.text


def test_a_source_with_nothing_trainable_stops_with_an_error(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n" * 5)
    it = _iterator(path, tokenizer)
    with pytest.raises(ValueError, match="consecutive records gave no trainable row"):
        next(it)


def test_corpus_directories_and_array_record_shards(tmp_path, rule_records, tokenizer):
    with data.CorpusWriter(tmp_path, "train", num_shards=3) as writer:
        for r in rule_records:
            writer.write(r)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"train-0000{k}-of-00003.array_record" for k in range(3)] + ["train.jsonl"]
    shards = data.open_source([tmp_path], split="train")
    lines = data.open_source([tmp_path / "train.jsonl"])
    assert len(shards) == len(lines) == len(rule_records)
    assert sorted(json.loads(shards[i])["id"] for i in range(len(shards))) == sorted(
        r["id"] for r in rule_records
    )
    it = data.sft_data(
        data.PipelineConfig(
            sources=(str(tmp_path),), split="train", seq_len=16384, global_batch_size=1
        ),
        tokenizer=tokenizer,
        process_index=0,
        process_count=1,
    )
    assert next(it)["input_ids"].shape == (1, 16384)
    with pytest.raises(FileNotFoundError, match="dev"):
        data.open_source([tmp_path], split="dev")


def test_an_aborted_writer_leaves_no_files(tmp_path, rule_records):
    with pytest.raises(RuntimeError), data.CorpusWriter(tmp_path, "train", num_shards=2) as w:
        w.write(rule_records[0])
        raise RuntimeError("teacher crashed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_worker_processes_give_the_same_batches_and_restore(chat_file, tokenizer):
    plain = _take(_iterator(chat_file, tokenizer, seed=5), 8)
    it = _iterator(chat_file, tokenizer, seed=5, worker_count=2)
    try:
        assert _same(_take(it, 4), plain[:4])
        state = json.loads(json.dumps(it.get_state()))
    finally:
        it.close()
    resumed = _iterator(chat_file, tokenizer, seed=5, worker_count=2)
    try:
        resumed.set_state(state)
        assert _same(_take(resumed, 4), plain[4:])
    finally:
        resumed.close()
    with pytest.raises(ValueError, match="different data config"):
        _iterator(chat_file, tokenizer, seed=5).set_state(state)
