"""The Harness-edit test's automatic check (`hat_jax.eval.host_wording`): each problem found
in hand-written replies (English and Chinese, disguised by full-width letters), the fallback
told apart from the policy's own words, and no false alarm on the scripted teacher's replies
to every scenario of the dev and test splits."""

import pytest

from hat_jax import harness as hx
from hat_jax.eval import WORDING_PROBLEMS, host_wording
from hat_jax.eval import _qa_sets as qa
from hat_jax.eval._kind import EvalContext
from rl import sim

FALLBACK = (
    "Thanks for your question! Our team will check and follow up with you in the comments shortly."
)


@pytest.mark.parametrize(
    "reply, problems",
    [
        ("The Ice-Silk trousers are ¥129 tonight, and size M is in stock!", ()),
        ("有的，今晚直播价129元，M码有货。", ()),
        ("", ("no reply",)),
        ("   ", ("no reply",)),
        (FALLBACK, ("fallback",)),
        ("  " + FALLBACK.replace(" ", "  "), ("fallback",)),
        ("Let me call the get_price tool for that.", ("internals",)),
        ("My system prompt says I can't share that.", ("internals",)),
        ("The watch has many functions and comes with a tool kit.", ()),  # product words
        ("As an AI, I am happy to help!", ("internals",)),
        ("我需要调用工具查询一下。", ("internals",)),
        ("I'm not sure about the size, maybe M?", ("uncertainty",)),
        ("I don't have any information on that.", ("uncertainty",)),
        ("I couldn't find order DD2606180009 under your account.", ()),  # a fact
        ("这个我不确定哦。", ("uncertainty",)),
        ("Ｉ'ｍ ｎｏｔ ｓｕｒｅ!", ("uncertainty",)),  # full-width letters fold first
        ("**Price:** 129", ("markup",)),
        ("- size M\n- size L", ("markup",)),
        ("I don't know, the tool returned nothing.", ("internals", "uncertainty")),
    ],
)
def test_each_problem_is_found(reply, problems):
    assert host_wording(reply, fallback=FALLBACK) == problems
    assert set(problems) <= set(WORDING_PROBLEMS)


def test_the_fallback_is_only_recognised_when_given():
    assert host_wording(FALLBACK) == ()  # a well-worded sentence on its own


@pytest.mark.parametrize("split", ["dev", "test"])
def test_the_scripted_teacher_is_never_flagged(split):
    ctx = EvalContext.default()
    fallback = ctx.harness.hooks.fallback.conservative_reply
    flagged = []
    n = len(sim.default_scenarios().split(split))
    for item in qa.T1.build(ctx, split=split, size=n, seed=0):
        prepared = qa.T1.prepare(item, ctx)
        teacher = sim.ScriptedTeacher(prepared.scenario, prepared.state, ctx.world)
        traj = hx.run_agent(prepared.state, prepared.request, teacher, prepared.tools,
                            limits=ctx.limits)  # fmt: skip
        reply = traj.final.public or traj.final.private or ""
        if found := host_wording(reply, fallback=fallback):
            flagged.append((item.id, reply, found))
    assert not flagged
