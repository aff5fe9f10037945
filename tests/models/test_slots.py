"""`models.SlotDecoder`: step-wise decoding with admission between steps.

- Greedy completions decoded through fewer slots than requests (so requests are admitted into
  slots other rows have just freed, beside rows at other positions) equal `models.Sampler`'s
  whole-batch completions token for token, with the same policy log-probs, for a hybrid
  DeltaNet/attention model and an attention-only one.
- A seeded sampled request gives the same tokens alone and beside other traffic, in any slot.
- Stop tokens end a row (emitted), limits cut it, a freed slot takes a new request; the decode
  step compiles once per strategy and admission once per prompt bucket; bad input fails clearly.
"""

import numpy as np
import pytest
from flax import nnx

from models import GREEDY, Qwen, QwenConfig, Sampler, Sampling, SlotDecoder

LENGTHS = (37, 5, 20, 61, 9)


def _hybrid() -> Qwen:
    config = QwenConfig.preset("tiny").replace(
        vocab_size=256, max_position_embeddings=256, dtype="float32", param_dtype="float32",
        moe_dispatch="dense",
    )  # fmt: skip
    return Qwen(config, rngs=nnx.Rngs(1))


def _attention_only() -> Qwen:
    config = QwenConfig.preset("qwen3_30b_a3b").replace(
        vocab_size=128, hidden_size=32, num_layers=2,
        layer_types=("full_attention", "full_attention"), num_heads=2, num_kv_heads=1,
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        max_position_embeddings=128, dtype="float32", param_dtype="float32", remat="none",
        moe_dispatch="dense",
    )  # fmt: skip
    return Qwen(config, rngs=nnx.Rngs(2))


@pytest.fixture(scope="module", params=["hybrid", "attention"])
def model(request):
    return _hybrid() if request.param == "hybrid" else _attention_only()


def _prompts(vocab: int, lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, n).tolist() for n in lengths]


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_greedy_through_slots_equals_the_whole_batch_sampler(model, steps_per_call):
    prompts = _prompts(model.config.vocab_size)
    budgets = [12, 3, 9, 12, 6]
    whole = Sampler(model, max_length=96)(prompts, max_new_tokens=budgets, sampling=GREEDY)
    decoder = SlotDecoder(model, slots=2, max_length=96, steps_per_call=steps_per_call)
    got = decoder.generate(prompts, max_new_tokens=budgets, sampling=GREEDY)
    for i, row in enumerate(got):
        assert row == whole.completion(i), f"row {i}"
    assert not decoder.active.any()


def test_policy_logprobs_equal_the_whole_batch_sampler(model):
    prompts = _prompts(model.config.vocab_size, (23, 11))
    whole = Sampler(model, max_length=64)(prompts, max_new_tokens=8, sampling=GREEDY)
    decoder = SlotDecoder(model, slots=2, max_length=64)
    firsts = [decoder.admit(i, p, max_new_tokens=8, sampling=GREEDY) for i, p in enumerate(prompts)]
    logps = [f.policy_logprobs_of(0) for f in firsts]
    while decoder.active.any():
        out = decoder.step()
        for slot in range(2):
            logps[slot] += out.policy_logprobs_of(slot)
    for i in range(2):
        np.testing.assert_allclose(logps[i], whole.policy_logprobs[i, :8], atol=5e-5)


def test_a_seeded_request_does_not_depend_on_its_neighbours():
    model = _hybrid()
    prompts = _prompts(model.config.vocab_size, (14, 30, 8, 19))
    hot = Sampling(temperature=1.3, top_k=50)
    alone = SlotDecoder(model, slots=1, max_length=64).generate(
        [prompts[0]], max_new_tokens=10, sampling=hot, seeds=[7]
    )[0]
    decoder = SlotDecoder(model, slots=3, max_length=64)
    crowd = decoder.generate(
        prompts[1:] + [prompts[0]], max_new_tokens=[4, 10, 2, 10],
        sampling=[Sampling(temperature=0.7, top_p=0.9), GREEDY, hot, hot], seeds=[1, 2, 3, 7],
    )  # fmt: skip
    assert crowd[-1] == alone
    other_seed = SlotDecoder(model, slots=1, max_length=64).generate(
        [prompts[0]], max_new_tokens=10, sampling=hot, seeds=[8]
    )[0]
    assert other_seed != alone


def test_stops_limits_and_reuse_of_a_freed_slot():
    model = _attention_only()
    prompt = _prompts(model.config.vocab_size, (17,))[0]
    reference = SlotDecoder(model, slots=1, max_length=64).generate(
        [prompt], max_new_tokens=8, sampling=GREEDY
    )[0]
    stop = reference[3]
    cut = reference[: reference.index(stop) + 1]
    decoder = SlotDecoder(model, slots=1, max_length=64, stop_tokens=[stop], steps_per_call=3)
    decoder.admit(0, prompt, max_new_tokens=8, sampling=GREEDY)
    tokens, ended = [], None
    while decoder.active.any():
        out = decoder.step()
        tokens += out.tokens_of(0)
        if out.finished[0]:
            ended = bool(out.stopped[0])
    assert [reference[0]] + tokens == cut and ended is True
    # The freed slot takes the next request; a one-token limit ends it at admission.
    first = decoder.admit(0, prompt, max_new_tokens=1, sampling=GREEDY)
    assert first.finished[0] and not first.stopped[0] and not decoder.active.any()
    assert first.tokens_of(0) == reference[:1]


def test_compiles_once_per_bucket_and_strategy():
    model = _attention_only()
    decoder = SlotDecoder(model, slots=2, max_length=64, min_bucket=16, steps_per_call=2)
    prompts = _prompts(model.config.vocab_size, (3, 9, 16, 12, 5, 2))
    decoder.generate(prompts, max_new_tokens=5, sampling=GREEDY)
    first = decoder.compilations
    # Admission: one prompt bucket; steps: one per attention-window bucket the rows reached.
    assert first["admit"] == 1 and 1 <= first["step"] <= 2
    decoder.generate(prompts[::-1], max_new_tokens=5, sampling=Sampling(temperature=1.0))
    assert decoder.compilations == first  # temperature is an array, not a program
    decoder.generate(prompts[:2], max_new_tokens=5, sampling=Sampling(top_k=5))
    assert decoder.compilations["admit"] == 2  # top-k is a strategy
    decoder.generate([[1] * 20], max_new_tokens=5, sampling=GREEDY)
    assert decoder.compilations["admit"] == 3  # a new prompt bucket


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: d.admit(2, [1], max_new_tokens=1), "slot 2 outside"),
        (lambda d: d.admit(0, [], max_new_tokens=1), "prompt is empty"),
        (lambda d: d.admit(0, [1], max_new_tokens=0), "max_new_tokens=0"),
        (lambda d: d.admit(0, [1] * 60, max_new_tokens=5), "> max_length=64"),
        (lambda d: d.admit(0, [1, 500], max_new_tokens=1), "outside \\[0, 128\\)"),
    ],
)
def test_bad_requests_fail_clearly(call, message):
    decoder = SlotDecoder(_attention_only(), slots=2, max_length=64)
    with pytest.raises(ValueError, match=message):
        call(decoder)


def test_a_busy_slot_is_refused():
    decoder = SlotDecoder(_attention_only(), slots=1, max_length=64)
    decoder.admit(0, [1, 2, 3], max_new_tokens=5, sampling=GREEDY)
    with pytest.raises(ValueError, match="slot 0 is busy"):
        decoder.admit(0, [4], max_new_tokens=1)
    decoder.cancel(0)
    decoder.admit(0, [4], max_new_tokens=2, sampling=GREEDY)
