"""`rl.JaxPolicy`: the Harness policy interface on a local model (tiny random Qwen3.5 and the
bundled demo tokenizer).

- A live-room episode runs end to end; every model call's token ids round-trip: the rendered
  prompt plus the generated ids decode to the prompt text plus the text the turn reports, and
  the log-probs are per token.
- Stopping at `<|im_end|>` and at the harness's max_tokens; rows of a batch are independent;
  new weights are taken without recompiling.
- RL rollouts sampled self-speculatively give the rows of plain ones (greedy).
"""

import jax
import numpy as np
import pytest
from flax import nnx

from data.tokenizer import load_tokenizer
from hat_jax import chat_format
from hat_jax import harness as hx
from models import MTPHead, Qwen, QwenConfig
from rl import JaxPolicy
from rl._rl_source import RLRolloutConfig, policy_for, slot_decoder_for
from rl._rollout import rollout
from rl.sim import HsaConfig, LiveRoom, SimConfig

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_price",
            "description": "Price of a product.",
            "parameters": {
                "type": "object",
                "properties": {"product": {"type": "string"}},
                "required": ["product"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    # The live room's system turn is ~4K demo tokens.
    config = QwenConfig.preset(
        "tiny", vocab_size=len(tokenizer), moe_dispatch="dense", max_position_embeddings=8192
    )
    return Qwen(config, rngs=nnx.Rngs(0))


def _conversation(question: str) -> list[dict]:
    return [
        {"role": "system", "content": "You sell things in a live room."},
        {"role": "user", "content": question},
    ]


@pytest.mark.slow
def test_live_room_episode_round_trips_token_ids(model, tokenizer):
    policy = JaxPolicy(model, tokenizer)
    # One model round keeps the test short; no time budget (the first call compiles).
    room = LiveRoom(SimConfig(limits=hx.Limits(max_rounds=1, budget_s=3600)))
    sampling = hx.SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=3)
    episode = room.run(policy, seed=0, sampling=sampling)
    calls = episode.trajectory.model_calls
    assert calls and all(c.error is None for c in calls)
    schemas = hx.tool_schemas(episode.state)
    for call in calls:
        out = call.output
        ids = out["token_ids"]
        assert 1 <= len(ids) <= 12 and len(out["logprobs"]) == len(ids)
        assert all(np.isfinite(x) and x <= 0 for x in out["logprobs"])
        text = chat_format.render(call.messages, schemas, add_generation_prompt=True)
        prompt = policy.prompt_ids(call.messages, schemas)
        assert tokenizer.decode(prompt, skip_special_tokens=False) == text
        decoded = tokenizer.decode(prompt + ids, skip_special_tokens=False)
        assert decoded == text + out["raw_text"]
    assert episode.rewards is not None


@pytest.mark.slow
def test_turns_stop_at_im_end_and_max_tokens(model, tokenizer):
    policy = JaxPolicy(model, tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in policy.stop_tokens
    conversations = [
        (_conversation("How much is the thermos?"), TOOLS),
        (_conversation("Do you ship abroad? Tell me everything about shipping."), []),
    ]
    greedy = hx.SamplingParams(temperature=0.0, max_tokens=9, enable_thinking=False)
    turns = policy.generate_batch(conversations, greedy)
    out = policy.last_output
    for i, turn in enumerate(turns):
        ids = list(turn.token_ids)
        assert len(ids) == 9 or ids[-1] in policy.stop_tokens
        assert im_end not in ids[:-1]
        assert turn.raw_text == tokenizer.decode(ids, skip_special_tokens=False)
        assert len(turn.logprobs) == len(ids)
        np.testing.assert_allclose(turn.logprobs, out.policy_logprobs[i, : len(ids)])
    # Rows are independent: the batch in the other order gives the same greedy turns.
    for turn, other in zip(turns, reversed(policy.generate_batch(conversations[::-1], greedy))):
        assert other.token_ids == turn.token_ids
        np.testing.assert_allclose(other.logprobs, turn.logprobs, atol=1e-5)

    # The model with the LM-head columns of its first greedy token and <|im_end|> swapped
    # says <|im_end|> at once: an empty reply ending on the stop token.
    first = turns[0].token_ids[0]
    graphdef, state = nnx.split(model)
    swapped = nnx.merge(graphdef, state)
    head = np.array(model.lm_head[...])
    head[:, [first, im_end]] = head[:, [im_end, first]]
    swapped.lm_head[...] = head
    forced = JaxPolicy(swapped, tokenizer, sampler=policy.sampler)
    forced.update(swapped)
    turn = forced.generate_batch(conversations, greedy)[0]
    assert turn.token_ids == (im_end,) and turn.raw_text == "<|im_end|>"
    assert turn.content == "" and not turn.tool_calls and forced.last_output.stopped[0]
    assert policy.sampler.compilations == 1  # new weights, same program


def test_bad_settings_fail_clearly(model, tokenizer):
    policy = JaxPolicy(model, tokenizer)
    with pytest.raises(hx.PolicyError, match="max_tokens=0"):
        policy.generate(_conversation("Hi"), [], hx.SamplingParams(max_tokens=0))
    long = _conversation("word " * 9000)
    with pytest.raises(hx.PolicyError, match="no room to generate"):
        policy.generate(long, [], hx.SamplingParams(max_tokens=4))
    small = nnx.eval_shape(lambda: Qwen(model.config.replace(vocab_size=64), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="vocab_size"):
        JaxPolicy(small, tokenizer)


def test_a_batch_shares_its_common_prefix_and_decodes_the_same(model, tokenizer):
    """`generate_batch` prefills the conversations' common leading tokens (system prompt, tool
    schemas) once; the turns equal those of a policy that prefills every row whole."""
    shared = JaxPolicy(model, tokenizer, share_prefix=16)
    whole = JaxPolicy(model, tokenizer, share_prefix=0)
    calls = []
    sampler_call = shared.sampler.__call__

    def spy(*args, **kwargs):
        calls.append(kwargs["shared_prefix"])
        return sampler_call(*args, **kwargs)

    shared.sampler = type("Spy", (), {"__call__": staticmethod(spy),
                                      "max_length": whole.sampler.max_length,
                                      "num_draft_tokens": 0})()  # fmt: skip
    conversations = [(_conversation(q), TOOLS) for q in ("price of the serum?", "any coupon?")]
    sampling = hx.SamplingParams(temperature=0.0, max_tokens=8, seed=1)
    a = shared.generate_batch(conversations, sampling)
    b = whole.generate_batch(conversations, sampling)
    assert calls and calls[0] > 0 and calls[0] % 16 == 0
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    with pytest.raises(ValueError, match="share_prefix"):
        JaxPolicy(model, tokenizer, share_prefix=-1)


@pytest.mark.slow
def test_speculative_rollouts_give_the_rows_of_plain_ones(model, tokenizer):
    """RL rollouts sampled self-speculatively (`rollout.num_draft_tokens`) through the
    lockstep barrier: greedy, the same segments token for token as plain sampling (multi-round
    episodes of the live room), log-probs from the verifier; the pooled acceptance length is
    reported (a random head: its drafts are rejected, so near 1)."""
    head = MTPHead(model.config, rngs=nnx.Rngs(1))
    room = LiveRoom(SimConfig(hsa=HsaConfig(dims=frozenset()),
                              limits=hx.Limits(max_rounds=2, budget_s=3600)))  # fmt: skip
    sampling = hx.SamplingParams(temperature=0.0, max_tokens=10)
    runs = {}
    for k in (0, 3):
        policy = policy_for(model, tokenizer, seq_len=8192, draft_head=head, num_draft_tokens=k)
        runs[k] = rollout(room, policy, scenarios=1, group_size=2, seed=0, sampling=sampling)
    plain, spec = runs[0], runs[3]
    assert plain.acceptance_length is None and spec.acceptance_length >= 1.0
    assert len(spec.segments) == len(plain.segments) >= 2
    for a, b in zip(plain.segments, spec.segments, strict=True):
        np.testing.assert_array_equal(b.prompt, a.prompt)
        np.testing.assert_array_equal(b.completion, a.completion)
        np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="num_draft_tokens > 0 needs an MTP head"):
        policy_for(model, tokenizer, seq_len=8192, num_draft_tokens=3)


def _micro_room():
    return LiveRoom(SimConfig(room="micro", hsa=HsaConfig(dims=frozenset()),
                              limits=hx.Limits(max_rounds=3, budget_s=3600)))  # fmt: skip


@pytest.mark.slow
def test_continuous_rollouts_give_the_lockstep_rows_greedy(model, tokenizer):
    """Rollouts decoded with continuous batching (`rollout(..., decoder=)`, the "slots"
    engine): greedy, the segments of the lockstep's, token for token (multi-round micro-room
    episodes whose calls end at different steps), with the policy's log-probs."""
    room = _micro_room()
    sampling = hx.SamplingParams(temperature=0.0, max_tokens=12)
    policy = policy_for(model, tokenizer, seq_len=4096)
    lockstep = rollout(room, policy, scenarios=2, group_size=2, seed=0, sampling=sampling)
    decoder = slot_decoder_for(policy, slots=4)
    slots = rollout(room, policy, scenarios=2, group_size=2, seed=0, sampling=sampling,
                    decoder=decoder)  # fmt: skip
    assert len(slots.segments) == len(lockstep.segments) >= 5
    assert slots.acceptance_length is None and slots.batches > 0
    for a, b in zip(lockstep.segments, slots.segments, strict=True):
        assert (a.episode, a.round, a.kind) == (b.episode, b.round, b.kind)
        np.testing.assert_array_equal(b.prompt, a.prompt)
        np.testing.assert_array_equal(b.completion, a.completion)
        np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=1e-4)
    assert not decoder.active.any()  # every slot free again


@pytest.mark.slow
def test_continuous_rollouts_sample_each_call_with_its_own_seed(model, tokenizer):
    """Sampled (temperature 1), a call's tokens depend on the weights, its prompt and its own
    seed only: the same rollout twice gives the same rows, whichever calls shared the decoder
    (here 2 slots for 4 episodes, so calls queue and join as others leave); the members of a
    group draw differently; the rows' log-probs are the policy's (a forward pass agrees)."""
    room = _micro_room()
    sampling = hx.SamplingParams(temperature=1.0, max_tokens=12)
    policy = policy_for(model, tokenizer, seq_len=4096)
    runs = [rollout(room, policy, scenarios=2, group_size=2, seed=5, sampling=sampling,
                    decoder=slot_decoder_for(policy, slots=slots)) for slots in (4, 2)]  # fmt: skip
    a, b = runs
    assert len(a.segments) == len(b.segments) >= 4
    for x, y in zip(a.segments, b.segments, strict=True):
        np.testing.assert_array_equal(x.completion, y.completion)
        np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=1e-4)
    first = [s.completion.tolist() for s in a.segments if s.round == 1]
    assert len({tuple(c) for c in first}) > 1  # the episodes' first calls draw differently
    seg = a.segments[0]
    ids = np.concatenate([seg.prompt, seg.completion])[None]
    logp = np.asarray(jax.nn.log_softmax(model(ids).logits[0].astype(np.float32), -1))
    p = len(seg.prompt)
    expected = logp[p - 1 : -1][np.arange(len(seg.completion)), seg.completion]
    np.testing.assert_allclose(seg.logprobs, expected, rtol=0, atol=2e-4)


def test_a_failing_decoder_fails_the_rollout_naming_its_error(model, tokenizer):
    class Broken:
        def free_slots(self):
            return [0]

        def admit(self, *args, **kwargs):
            raise RuntimeError("the decoder broke")

    room = _micro_room()
    policy = policy_for(model, tokenizer, seq_len=4096)
    with pytest.raises(RuntimeError, match="the decoder broke"):
        rollout(room, policy, scenarios=1, group_size=2, seed=0, decoder=Broken(),
                sampling=hx.SamplingParams(temperature=0.0, max_tokens=4))  # fmt: skip


def test_the_rollout_engine_is_checked():
    with pytest.raises(ValueError, match="engine='warp'"):
        RLRolloutConfig(engine="warp")
    with pytest.raises(
        ValueError, match="num_draft_tokens=3 and sample_chunk=0 apply to the lockstep"
    ):
        RLRolloutConfig(engine="slots", num_draft_tokens=3)
    assert RLRolloutConfig(engine="slots").engine == "slots"
