"""Packed rows from the pipeline, checked against the model's segment handling: no segment
sees another, and the trainer's targets never cross a segment boundary."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import data
from hat_jax import train
from models import Qwen, QwenConfig


@pytest.fixture(scope="module")
def model_and_batch(chat_file, tokenizer):
    config = QwenConfig.preset("tiny").replace(vocab_size=len(tokenizer))
    model = Qwen(config, rngs=nnx.Rngs(0))
    it = data.sft_data(
        data.PipelineConfig(
            sources=(str(chat_file),), seq_len=256, global_batch_size=2, pack_bins=4, seed=2
        ),
        tokenizer=tokenizer,
        process_index=0,
        process_count=1,
    )
    batch = next(b for b in it if (b["segment_ids"].max(axis=1) >= 2).all())
    return model, batch


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, ids, segment_ids, positions):
    model = nnx.merge(graphdef, state)
    return model(ids, segment_ids=segment_ids, positions=positions).logits


def _run(model, ids, segment_ids=None, positions=None):
    graphdef, state = nnx.split(model)
    ids = jnp.asarray(ids)[None] if np.ndim(ids) == 1 else jnp.asarray(ids)
    return np.asarray(_logits(graphdef, state, ids, segment_ids, positions))


@pytest.mark.slow
def test_a_packed_row_equals_its_conversations_run_alone(model_and_batch):
    """Each conversation alone: its own row, no segment ids, right-padded (causal, so the
    padding cannot reach it); one call for all of them."""
    model, batch = model_and_batch
    packed = _run(model, batch["input_ids"], batch["segment_ids"], batch["positions"])
    where, alone_ids = [], []
    for r in range(batch["input_ids"].shape[0]):
        seg = batch["segment_ids"][r]
        for s in np.unique(seg[seg > 0]):
            idx = np.flatnonzero(seg == s)
            row = np.full(seg.shape, batch["input_ids"][r, -1], np.int32)
            row[: len(idx)] = batch["input_ids"][r, idx]
            where.append((r, idx))
            alone_ids.append(row)
    alone = _run(model, np.stack(alone_ids))
    assert len(where) > 2
    for k, (r, idx) in enumerate(where):
        np.testing.assert_allclose(packed[r, idx], alone[k, : len(idx)], rtol=1e-5, atol=1e-6)


def test_changing_one_conversation_leaves_the_others_unchanged(model_and_batch):
    model, batch = model_and_batch
    before = _run(model, batch["input_ids"], batch["segment_ids"], batch["positions"])
    seg = batch["segment_ids"][0]
    first = seg == 1
    ids = batch["input_ids"].copy()
    ids[0, first] = (ids[0, first] + 7) % model.config.vocab_size
    after = _run(model, ids, batch["segment_ids"], batch["positions"])
    assert not np.allclose(before[0, first], after[0, first])
    # equal up to float reassociation (the MoE dispatch groups tokens of the whole batch)
    np.testing.assert_allclose(before[0, ~first], after[0, ~first], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(before[1], after[1], rtol=1e-5, atol=1e-6)


def test_the_trainers_targets_stay_inside_segments(model_and_batch):
    _, batch = model_and_batch
    targets, weights = train.next_token_targets({k: jnp.asarray(v) for k, v in batch.items()})
    weights = np.asarray(weights)
    seg, mask = batch["segment_ids"], batch["loss_mask"]
    expected = 0
    for r in range(seg.shape[0]):
        for s in np.unique(seg[r][seg[r] > 0]):
            expected += int(mask[r, seg[r] == s][1:].sum())  # a segment's first token is no target
    assert int(weights.sum()) == expected == int(mask.sum())  # every first token is a prompt token
    assert np.all(seg[:, 1:][weights] == seg[:, :-1][weights])
    np.testing.assert_array_equal(np.asarray(targets)[weights], batch["input_ids"][:, 1:][weights])
