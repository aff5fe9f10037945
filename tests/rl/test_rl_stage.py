"""HSA-RL: the rollout rows token by token (multi-round episodes with tool results, Hook
retries and a fallback), advantages equal to `rl.hat_advantages`, a policy that learns a
synthetic reward (8 devices = 1: `test_rl_stage_mesh.py`; reruns and kill-and-resume:
`test_rl_stage_resume.py`, modules of their own so that they run beside these)."""

import dataclasses
import json
import pathlib
import zlib

import numpy as np
import pytest

import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import chat_format
from hat_jax import harness as hx
from hat_jax.metrics import read_metrics
from rl.advantages import REWARD_DIMS
from rl.sim import HsaConfig, LiveRoom, SimConfig
from tests.rl import rl_check

ROOT = pathlib.Path(__file__).resolve().parents[2]


class _ScriptedBatchPolicy:
    """`generate_batch` without a model: a bad tool call (a Hook sends it back), a valid
    `load_skill`, then a reply — or, on every third episode, unreadable text until the retries
    run out (the fallback). Completions are the exact tokens of the rendered turns."""

    def __init__(self, tokenizer):
        self.tokenizer, self.last_output, self.calls = tokenizer, None, 0

    def _message(self, messages) -> dict:
        assistant = sum(m["role"] == "assistant" for m in messages)
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        if zlib.crc32(first_user.encode()) % 3 == 0:
            return {"role": "assistant", "content": "<tool_call>\n<function=load_skill"}
        call = lambda name, args: {"role": "assistant", "content": "", "reasoning_content":  # noqa: E731
                                   f"round {assistant + 1}", "tool_calls": [
                                       {"type": "function", "function": {"name": name,
                                                                         "arguments": args}}]}  # fmt: skip
        if assistant == 0:
            return call("load_skill", {"name": ""})  # fails the schema: a Hook retry
        if assistant == 1:
            return call("load_skill", {"name": "general-reply"})
        return call("reply_public", {"text": "Thanks for watching, the details are coming."})

    def generate_batch(self, conversations, sampling):
        prompts, completions, turns = [], [], []
        for messages, tools in conversations:
            text = chat_format.render(messages, tools, add_generation_prompt=True,
                                      enable_thinking=sampling.enable_thinking)  # fmt: skip
            prompts.append(np.asarray(self.tokenizer.encode(text, add_special_tokens=False)))
            message = self._message(messages)
            try:
                completion = chat_format.render_completion(message, enable_thinking=True)
            except ValueError:  # unreadable text is its own completion
                completion = message["content"] + "<|im_end|>"
            ids = self.tokenizer.encode(completion, add_special_tokens=False)
            completions.append(ids)
            parsed = chat_format.parse(self.tokenizer.decode(ids, skip_special_tokens=False),
                                       tools)  # fmt: skip
            turns.append(hx.AssistantTurn(
                content=parsed.content, reasoning=parsed.reasoning,
                tool_calls=tuple(hx.ToolCall(id=f"c{i}", name=c.name, arguments=dict(c.arguments))
                                 for i, c in enumerate(parsed.tool_calls)),
                token_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                parse_errors=tuple(parsed.errors)))  # fmt: skip
        width = max(len(c) for c in completions)
        tokens = np.zeros((len(completions), width), np.int32)
        logprobs = np.zeros((len(completions), width), np.float32)
        for i, ids in enumerate(completions):
            tokens[i, : len(ids)], logprobs[i, : len(ids)] = ids, -0.5
        self.last_output = models.SampleOutput(
            prompts=tuple(prompts), tokens=tokens,
            lengths=np.asarray([len(c) for c in completions]), logprobs=logprobs,
            policy_logprobs=logprobs, stopped=np.ones(len(completions), bool), pad_id=0,
        )  # fmt: skip
        self.calls += 1
        return turns


def test_rows_hold_exactly_the_sampled_tokens_of_multi_round_episodes():
    tokenizer = load_tokenizer()
    room = LiveRoom(SimConfig(hsa=HsaConfig(dims=frozenset()),
                              limits=hx.Limits(max_rounds=4, budget_s=1e6)))  # fmt: skip
    policy = _ScriptedBatchPolicy(tokenizer)
    sampling = hx.SamplingParams(temperature=1.0, max_tokens=512, enable_thinking=True)
    r = rl.rollout(room, policy, scenarios=3, group_size=2, seed=5, sampling=sampling)
    trajectories = [e.trajectory for e in r.episodes]
    # What the episodes went through: tool results, a Hook retry, a fallback.
    assert any(t.tool_calls for t in trajectories)
    assert any(e.outcome == "retry" for t in trajectories for e in t.hook_events)
    assert any(t.final.fallback for t in trajectories) and any(
        not t.final.fallback for t in trajectories
    )
    assert policy.calls == r.batches < sum(len(t.model_calls) for t in trajectories)  # batched
    rows, dropped = rl.rollout_rows(r.segments, np.arange(len(r.segments), dtype=np.float32),
                                    seq_len=8192, pad_id=0)  # fmt: skip
    assert dropped == 0 and len(rows["input_ids"]) == len(r.segments)
    by_episode = {i: [s for s in r.segments if s.episode == i] for i in range(len(r.episodes))}
    tools = hx.tool_schemas(hx.HarnessState(harness=room.harness))
    k = 0
    for i, t in enumerate(trajectories):
        calls = [c for c in t.model_calls if c.output is not None]
        assert len(calls) == len(by_episode[i])
        for call, segment in zip(calls, by_episode[i], strict=True):
            ids, mask = rows["input_ids"][k], rows["loss_mask"][k]
            n = len(segment.prompt) + len(segment.completion)
            # Context: exactly the rendered conversation the call saw (system prompt, viewer,
            # earlier turns, tool results and Hook messages): all mask 0.
            context = chat_format.render(call.messages, tools, add_generation_prompt=True)
            assert ids[: len(segment.prompt)].tolist() == tokenizer.encode(
                context, add_special_tokens=False
            )
            assert not mask[: len(segment.prompt)].any() and not mask[n:].any()
            # Sampled: exactly the turn's own token ids, all mask 1, with their log-probs.
            assert ids[mask == 1].tolist() == call.output["token_ids"]
            assert mask[len(segment.prompt) : n].all()
            np.testing.assert_array_equal(rows["old_logprobs"][k][mask == 1], -0.5)
            assert (rows["advantages"][k][:n] == k).all() and rows["segment_ids"][k][:n].all()
            k += 1


def test_advantages_are_hat_advantages_and_an_equal_group_contributes_nothing():
    room = LiveRoom(SimConfig(hsa=HsaConfig(dims=frozenset()),
                              limits=hx.Limits(max_rounds=4, budget_s=1e6)))  # fmt: skip
    r = rl.rollout(room, _ScriptedBatchPolicy(load_tokenizer()), scenarios=3, group_size=2,
                   seed=7, sampling=hx.SamplingParams(max_tokens=512))  # fmt: skip
    config = rl.HatAdvantageConfig()
    got = rl.segment_advantages(r, config)
    rewards = np.stack([r.episodes[s.episode].rewards.as_array() for s in r.segments])
    want = rl.hat_advantages(rewards, np.asarray([s.kind for s in r.segments]),
                             np.asarray([s.group for s in r.segments]),
                             np.asarray([s.cot_length for s in r.segments], np.float32), config)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(got.advantages), np.asarray(want.advantages))
    np.testing.assert_array_equal(np.asarray(got.keep), np.asarray(want.keep))
    # A group whose episodes all scored the same: zero advantage, filtered out.
    same = dataclasses.replace(r, episodes=[dataclasses.replace(e, rewards=r.episodes[0].rewards)
                                            for e in r.episodes])  # fmt: skip
    out = rl.segment_advantages(same, dataclasses.replace(config, length_weight=0.0))
    assert not np.asarray(out.advantages).any() and not np.asarray(out.keep).any()


LEARNING_STEPS = 28


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """At learning rate 3e-2 the training reward leaves its chance level (~1/6) and holds
    >= 0.94 from rollout 7 on (at 1e-2 that took ~35 rollouts); with the trainer's seed at 1
    or 2 instead of 0, from rollout 19 and 8. The last 5 of 28 rollouts, which the test
    averages, lie past all three."""
    run_dir = tmp_path_factory.mktemp("rl")
    config = rl_check.stage_config(steps=LEARNING_STEPS, learning_rate=3e-2)
    return run_dir, rl_check.run(run_dir, config=config)


@pytest.mark.slow
def test_the_policy_learns_a_synthetic_reward(learned):
    run_dir, result = learned
    steps = [r for r in read_metrics(run_dir) if "reward/accuracy" in r]
    curve = [r["reward/accuracy"] for r in steps]
    print("training reward per rollout:", [round(x, 2) for x in curve])
    assert np.mean(curve[:3]) < 0.3 and np.mean(curve[-5:]) >= 0.9
    assert result.before["reward/mean"] < 0.3 and result.after["reward/mean"] >= 0.9
    # The same held-out episodes before and after, paired: the change and its interval.
    change = result.change["mean"]
    assert change["before"] == pytest.approx(result.before["reward/mean"])
    assert change["after"] == pytest.approx(result.after["reward/mean"])
    assert 0 < change["low"] <= change["delta"] <= change["high"]
    assert set(result.change) == {*REWARD_DIMS, "mean"}
    for key in ("clip_low", "clip_high", "ratio_mean", "logprob_mismatch", "filtered",
                "q_length", "cot_length/reply", "faults", "rounds", "trajectories_per_second",
                "sampling_seconds", "learn_seconds", "data_seconds"):  # fmt: skip
        assert any(key in r for r in steps), key
    # The first minibatch of a rollout recomputes the sampler's log-probs with the same weights.
    mismatch = [r["logprob_mismatch"] for r in steps if "logprob_mismatch" in r]
    assert mismatch and max(mismatch) < 1e-4
    last = run_dir / "trajectories" / f"step_{LEARNING_STEPS}.md"
    assert last.is_file()
    assert "**rewards:**" in last.read_text()
    metadata = json.loads((run_dir / "rl_run.json").read_text())
    assert metadata["limits"]["budget_s"] == 1e6
