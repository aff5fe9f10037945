"""Helpers shared by the data tests: real agent runs and corpus records of them."""

import pathlib

import data
from hat_jax import harness as hx

COMMENTS = [
    "how much is the serum?",
    "is the serum in stock?",
    "what sizes do you have?",
    "do you ship to Xinjiang?",
    "can I return it if it doesn't suit me?",
    "hello everyone!",
    "how much is the serum and is it in stock?",
    "any coupons today?",
    "is the serum good for dry skin?",
    "when does the promotion end?",
]


def run(state, world, tools, policy, text="how much is the serum?", viewer="v1001", rid="r0"):
    """One agent run in `state` (generous limits so scripted retries fit)."""
    request = world.make_request(hx.Comment(text=text, viewer_id=viewer), request_id=rid)
    return hx.run_agent(state, request, policy, tools, limits=hx.Limits(max_rounds=6, budget_s=60))


def record_of(traj, state, rid, *, keep_retries=False):
    """A corpus record of `traj` run in `state`."""
    return data.corpus_record(
        traj,
        record_id=rid,
        tools=[dict(t) for t in hx.tool_schemas(state)],
        state=data.state_info(state),
        keep_retries=keep_retries,
    )


REPO = pathlib.Path(__file__).resolve().parents[2]
