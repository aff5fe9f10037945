"""Cached decoding equals the full forward pass, for both families (float32).

A batch of three prompts of different lengths (one shorter than the DeltaNet conv window, one
longer than a delta-rule chunk) is prefilled left- or right-padded into a cache and then
continued with calls of 1, 3 and 7 tokens (the recurrent path with history, and the chunked
path from a cached state); every logit must equal the same sequences run through the
uncached model. Rewinding after a 3-token call and feeding other tokens must equal feeding
only the kept ones.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import Qwen, QwenConfig, chunked_gated_delta_rule
from models._deltanet import delta_rule_steps
from tests.models.qwen_fixtures import tiny_qwen3_moe

TOLERANCE = 2e-5
PROMPT_LENGTHS = (21, 2, 13)  # 2 < conv kernel - 1; 21 > the chunk size of 16
PROMPT_SLOTS = 24
CALLS = (1, 3, 1, 7, 1)  # tokens per cached call after the prefill
SLOTS = 48

CONFIGS = {
    # The dense MoE dispatch compiles fastest (the dispatches are compared elsewhere).
    "qwen3_5": QwenConfig.preset(
        "tiny", vocab_size=256, deltanet_chunk_size=16, moe_dispatch="dense"
    ),
    "qwen3_moe": tiny_qwen3_moe(vocab_size=256, param_dtype="float32", moe_dispatch="dense"),
}


@functools.partial(jax.jit, static_argnums=0)
def _full(graphdef, state, ids, segment_ids):
    return nnx.merge(graphdef, state)(ids, segment_ids=segment_ids).logits


@functools.partial(jax.jit, static_argnums=0)
def _cached(graphdef, state, ids, segment_ids, cache):
    out = nnx.merge(graphdef, state)(ids, segment_ids=segment_ids, cache=cache)
    return out.logits, out.cache


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request):
    config = CONFIGS[request.param]
    model = Qwen(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(1)
    total = max(PROMPT_LENGTHS) + sum(CALLS)
    tokens = rng.integers(0, config.vocab_size, (len(PROMPT_LENGTHS), total)).astype(np.int32)
    # Reference: each row's real tokens, right-padded, through the uncached model.
    lengths = np.asarray(PROMPT_LENGTHS) + sum(CALLS)
    segment_ids = (np.arange(total)[None] < lengths[:, None]).astype(np.int32)
    reference = np.asarray(_full(graphdef, state, tokens, segment_ids))
    return model, graphdef, state, tokens, reference


def _prompt_batch(tokens, padding):
    batch = len(PROMPT_LENGTHS)
    ids = np.zeros((batch, PROMPT_SLOTS), np.int32)
    seg = np.zeros((batch, PROMPT_SLOTS), np.int32)
    for b, n in enumerate(PROMPT_LENGTHS):
        span = slice(0, n) if padding == "right" else slice(PROMPT_SLOTS - n, PROMPT_SLOTS)
        ids[b, span], seg[b, span] = tokens[b, :n], 1
    return ids, seg


@pytest.mark.parametrize("padding", ["right", "left"])
def test_cached_calls_match_full_forward(setup, padding):
    model, graphdef, state, tokens, reference = setup
    ids, seg = _prompt_batch(tokens, padding)
    cache = model.init_cache(len(PROMPT_LENGTHS), SLOTS, rollback=3)
    logits, cache = _cached(graphdef, state, ids, seg, cache)
    logits = np.asarray(logits)
    for b, n in enumerate(PROMPT_LENGTHS):
        got = logits[b, :n] if padding == "right" else logits[b, PROMPT_SLOTS - n :]
        np.testing.assert_allclose(got, reference[b, :n], atol=TOLERANCE, rtol=0)
    offset = 0
    for size in CALLS:
        block = np.stack(
            [tokens[b, n + offset : n + offset + size] for b, n in enumerate(PROMPT_LENGTHS)]
        )
        logits, cache = _cached(graphdef, state, block, None, cache)
        for b, n in enumerate(PROMPT_LENGTHS):
            want = reference[b, n + offset : n + offset + size]
            np.testing.assert_allclose(np.asarray(logits[b]), want, atol=TOLERANCE, rtol=0)
        offset += size
    np.testing.assert_array_equal(np.asarray(cache.end), np.asarray(PROMPT_LENGTHS) + offset)


def test_rewind_equals_feeding_only_kept_tokens(setup):
    model, graphdef, state, tokens, _ = setup
    ids, seg = _prompt_batch(tokens, "right")
    batch = len(PROMPT_LENGTHS)
    prefilled = _cached(graphdef, state, ids, seg, model.init_cache(batch, SLOTS, rollback=3))[1]
    rng = np.random.default_rng(2)
    block = rng.integers(0, 256, (batch, 3)).astype(np.int32)
    follow = rng.integers(0, 256, (batch, 3)).astype(np.int32)
    drop = np.array([2, 0, 3])
    _, speculative = _cached(graphdef, state, block, None, prefilled)
    got, _ = _cached(graphdef, state, follow, None, speculative.rewind(jnp.asarray(drop)))
    for b in range(batch):
        kept = 3 - drop[b]
        # Feed the kept tokens and the follow-up as one right-padded call on row b's cache.
        row = np.zeros((batch, 6), np.int32)
        row_seg = np.zeros((batch, 6), np.int32)
        row[:, : kept + 3] = np.concatenate([block[:, :kept], follow], axis=1)
        row_seg[:, : kept + 3] = 1
        want, cache = _cached(graphdef, state, row, row_seg, prefilled)
        np.testing.assert_allclose(
            np.asarray(got[b]), np.asarray(want[b, kept : kept + 3]), atol=TOLERANCE, rtol=0
        )
        assert int(cache.end[b]) == PROMPT_LENGTHS[b] + kept + 3


def test_delta_rule_steps_equal_chunked_form():
    rng = np.random.default_rng(0)
    batch, length, heads, dk, dv = 2, 37, 3, 8, 5

    def normal(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    q, k = unit(normal(batch, length, heads, dk)), unit(normal(batch, length, heads, dk))
    v = normal(batch, length, heads, dv)
    g = -jnp.abs(normal(batch, length, heads)) * 0.3
    beta = jax.nn.sigmoid(normal(batch, length, heads))
    start = normal(batch, heads, dk, dv)
    doc = jnp.zeros((batch, length), jnp.int32)
    chunked = jax.jit(functools.partial(chunked_gated_delta_rule, chunk_size=16))
    out_c, final_c = chunked(q, k, v, g, beta, doc, initial_state=start)
    out_s, states = jax.jit(delta_rule_steps)(q, k, v, g, beta, start)
    np.testing.assert_allclose(np.asarray(out_s), np.asarray(out_c), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(states[:, -1]), np.asarray(final_c), atol=1e-5)
    # The state after token 19 is the chunked form's final state over the first 20 tokens.
    first = [x[:, :20] for x in (q, k, v, g, beta, doc)]
    _, final_20 = chunked(*first, initial_state=start)
    np.testing.assert_allclose(np.asarray(states[:, 19]), np.asarray(final_20), atol=1e-5)


def test_bad_cache_inputs_fail_clearly():
    config = CONFIGS["qwen3_5"]
    model = Qwen(config, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="init_cache"):
        model.init_cache(0, 8)
    other = QwenConfig.preset("tiny", vocab_size=256, num_layers=8,
                              layer_types=("full_attention",) * 8)  # fmt: skip
    wrong = Qwen(other, rngs=nnx.Rngs(0)).init_cache(1, 8)
    with pytest.raises(ValueError, match="layer pattern"):
        model(jnp.zeros((1, 2), jnp.int32), cache=wrong)
    with pytest.raises(ValueError, match="segment_ids shape"):
        model(
            jnp.zeros((1, 2), jnp.int32), segment_ids=jnp.ones((1, 3)), cache=model.init_cache(1, 8)
        )
