"""The evaluation runner on a minimal set kind of its own (the real kinds have their own tests):
per-item files and summaries, resuming after a crash without redoing finished items, refusing
another set version, an unreachable endpoint named, batched decoding of a tiny JAX policy
identical across runs and equal to decoding one item at a time."""

import dataclasses
import json

import httpx
import pytest
from flax import nnx

from data.tokenizer import load_tokenizer
from hat_jax import harness as hx
from hat_jax import llm_client
from hat_jax.eval._items import EvalItem, EvalSet, SetVersionError
from hat_jax.eval._kind import EvalContext, Prepared
from hat_jax.eval._run import (
    BatchedPolicy,
    EndpointPolicy,
    EvalError,
    FactoryPolicy,
    RunConfig,
    evaluate,
    read_items,
    read_summary,
)


class EchoKind:
    """Single-call items: the reply must contain the item's word."""

    name = "echo"
    metrics = ("hit", "avg")

    def build(self, ctx, *, split, size, seed):
        del ctx, split
        items = [
            EvalItem(
                id=f"e{k}",
                set="echo",
                family="even" if k % 2 == 0 else "odd",
                prompt={"messages": [{"role": "user", "content": f"say w{k + seed}"}]},
                expect={"word": f"w{k + seed}"},
            )  # fmt: skip
            for k in range(size)
        ]
        return EvalSet("echo", tuple(items), {"size": size, "seed": seed})

    def prepare(self, item, ctx):
        return Prepared(state=hx.HarnessState(harness=ctx.harness),
                        messages=item.prompt["messages"])  # fmt: skip

    def score(self, item, prepared, turn):
        hit = float(item.expect["word"] in (turn.content or ""))
        return {"hit": hit, "avg": hit}


KINDS = {"echo": EchoKind()}


@pytest.fixture(scope="module")
def ctx():
    return EvalContext.default()


def _echo_policy(fail_after=None, counter=None):
    """Answers 'w<k>' for even k and 'nope' for odd k; raises after `fail_after` calls."""

    def factory(prepared, ctx):
        def step(messages, tools):
            if counter is not None:
                counter.append(messages[-1]["content"])
                if fail_after is not None and len(counter) > fail_after:
                    raise KeyboardInterrupt("simulated crash")
            word = messages[-1]["content"].split()[-1]
            k = int(word[1:])
            return hx.AssistantTurn(content=word if k % 2 == 0 else "nope")

        return hx.ScriptedPolicy([step])

    return FactoryPolicy(factory, describe={"kind": "echo"})


def test_items_and_summary(ctx, tmp_path):
    s = EchoKind().build(ctx, split="test", size=6, seed=0)
    summary = evaluate([s], _echo_policy(), kinds=KINDS, ctx=ctx, run_dir=tmp_path,
                       config=RunConfig(batch_size=4), progress=False)  # fmt: skip
    got = summary["sets"]["echo"]
    assert got["version"] == s.version and got["n"] == 6
    assert got["metrics"] == {"hit": 0.5, "avg": 0.5}
    assert got["families"]["even"] == {"n": 3, "hit": 1.0, "avg": 1.0}
    assert got["families"]["odd"]["hit"] == 0.0
    items = read_items(tmp_path, "echo")
    assert [r["id"] for r in items] == [f"e{k}" for k in range(6)]
    assert items[0]["output"] == "w0" and items[1]["output"] == "nope"
    assert read_summary(tmp_path) == json.loads(json.dumps(summary))


def test_resume_after_a_crash_does_not_redo_finished_items(ctx, tmp_path):
    s = EchoKind().build(ctx, split="test", size=10, seed=0)
    calls = []
    with pytest.raises(KeyboardInterrupt):
        evaluate([s], _echo_policy(fail_after=6, counter=calls), kinds=KINDS, ctx=ctx,
                 run_dir=tmp_path, config=RunConfig(batch_size=4), progress=False)  # fmt: skip
    # The first chunk (4 items) was written; the second crashed in flight and left nothing.
    assert [r["id"] for r in read_items(tmp_path, "echo")] == ["e0", "e1", "e2", "e3"]
    calls.clear()
    summary = evaluate([s], _echo_policy(counter=calls), kinds=KINDS, ctx=ctx,
                       run_dir=tmp_path, config=RunConfig(batch_size=4), progress=False)  # fmt: skip
    assert len(calls) == 6  # only e4..e9
    assert summary["sets"]["echo"]["n"] == 10
    assert [r["id"] for r in read_items(tmp_path, "echo")] == [f"e{k}" for k in range(10)]


def test_another_set_version_is_refused(ctx, tmp_path):
    a = EchoKind().build(ctx, split="test", size=4, seed=0)
    evaluate([a], _echo_policy(), kinds=KINDS, ctx=ctx, run_dir=tmp_path, progress=False)
    b = EchoKind().build(ctx, split="test", size=4, seed=1)
    with pytest.raises(SetVersionError, match=a.version):
        evaluate([b], _echo_policy(), kinds=KINDS, ctx=ctx, run_dir=tmp_path, progress=False)


def test_an_unreachable_endpoint_is_named(ctx, tmp_path):
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    policy = hx.OpenAICompatPolicy(
        base_url="http://127.0.0.1:9/v1", model="m", transport=httpx.MockTransport(refuse),
        retry=llm_client.RetryPolicy(attempts=2, sleep=lambda s: None),
    )  # fmt: skip
    s = EchoKind().build(ctx, split="test", size=2, seed=0)
    ep = EndpointPolicy(policy, describe={"kind": "openai", "endpoint": "http://127.0.0.1:9/v1"})
    with pytest.raises(EvalError, match=r"127\.0\.0\.1:9.*does not answer"):
        evaluate([s], ep, kinds=KINDS, ctx=ctx, run_dir=tmp_path, progress=False)
    assert not (tmp_path / "items").exists()


def test_batched_jax_policy_is_deterministic_and_matches_one_at_a_time(ctx, tmp_path):
    import models
    import rl

    tok = load_tokenizer()
    config = models.QwenConfig.preset("tiny").replace(vocab_size=-(-len(tok) // 128) * 128)
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    policy = rl.JaxPolicy(model, tok)
    s = EchoKind().build(ctx, split="test", size=6, seed=0)
    config_ = RunConfig(sampling=dataclasses.replace(RunConfig().sampling, max_tokens=6),
                        batch_size=6)  # fmt: skip
    outputs = []
    runs = (("a", 6, "lockstep"), ("b", 6, "lockstep"), ("c", 1, "lockstep"), ("d", 6, "slots"),
            ("e", 4, "slots"))  # fmt: skip
    for name, batch, engine in runs:
        evaluate([s], BatchedPolicy(policy, describe={"kind": "jax"}, engine=engine),
                 kinds=KINDS, ctx=ctx, run_dir=tmp_path / name,
                 config=dataclasses.replace(config_, batch_size=batch), progress=False)  # fmt: skip
        outputs.append([r["output"] for r in read_items(tmp_path / name, "echo")])
    assert outputs[0] == outputs[1]
    assert outputs[0] == outputs[2]
    # Greedy, continuous batching gives the lockstep's answers (a chunk of 4 then of 2).
    assert outputs[3] == outputs[0] and outputs[4] == outputs[0]
    assert any(outputs[0])  # the random model says something
    with pytest.raises(ValueError, match="engine='warp'"):
        BatchedPolicy(policy, describe={}, engine="warp")
