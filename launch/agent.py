"""Answer viewer comments with the Harness runtime; print the spoken replies; write trajectories.

  python -m launch.agent --comment "how much is the serum?"
  python -m launch.agent --comments_file comments.jsonl --mode multi
  python -m launch.agent --comment "any coupons?" --policy openai \
      --base_url http://localhost:30000/v1 --model hat-policy --server_extensions
  python -m launch.agent --comment "is the serum in stock?" --policy jax \
      --checkpoint runs/demo/sft/checkpoints               # a trained checkpoint (Orbax or HF)
  python -m launch.agent --comment "how much is the serum?" --room micro   # the micro Harness

`--room` (`hat_jax.livestream.ROOMS`) picks the released Harness: on the bundled world the
room's (`livestream.room(name).harness_dir`); on another `--world` folder, its Harness folder of
the same name (`harness/` for v0, as before rooms).

`--comments_file` takes plain text (one comment per line) or JSONL
(`{"text", "viewer_id", "handle", "ts"}`). The default policy is the offline rule-based baseline;
`--policy openai` uses any OpenAI-compatible endpoint (`--server_extensions` for SGLang's request
fields, which `--enable_thinking` needs). Marketing tools come from the bundled MCP
service, discovered at start-up (`--mcp stdio|inprocess|<url>|none`).
"""

import contextlib
import json
import os
import pathlib

from absl import app, flags

from hat_jax import harness as hx
from hat_jax import livestream
from launch import _logs, _policy

_WORLD = flags.DEFINE_string(
    "world", str(livestream.default_world_dir()), "World folder with harness/."
)
_ROOM = flags.DEFINE_enum(
    "room", "v0", list(livestream.ROOMS), "The live room: which released Harness answers."
)
_COMMENT = flags.DEFINE_string("comment", None, "One viewer comment to answer.")
_FILE = flags.DEFINE_string("comments_file", None, "Text (one per line) or JSONL comments.")
_VIEWER = flags.DEFINE_string("viewer", "v1001", "Viewer id for --comment (see viewers.json).")
_MODE = flags.DEFINE_enum(
    "mode",
    "single",
    ["single", "multi"],
    "Answer comments one by one, or related comments together.",
)
_WINDOW = flags.DEFINE_float(
    "window_s", 30.0, "Multi mode: seconds within which comments can be related."
)
_POLICY = flags.DEFINE_enum("policy", "rules", ["rules", "openai", "jax"], "Which policy answers.")
_JAX = _policy.define_jax_flags()
_BASE_URL = flags.DEFINE_string(
    "base_url", "http://localhost:30000/v1", "OpenAI-compatible API root."
)
_MODEL = flags.DEFINE_string("model", "default", "Model name for --policy openai.")
_KEY_ENV = flags.DEFINE_string(
    "api_key_env", "OPENAI_API_KEY", "Environment variable holding the API key."
)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "Sampling temperature (openai, jax).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Token budget per model call.")
_THINKING = flags.DEFINE_bool(
    "enable_thinking", True, "Ask the server for reasoning (openai policy, --server_extensions)."
)
_EXTENSIONS = flags.DEFINE_bool(
    "server_extensions",
    False,
    "Send SGLang's chat_template_kwargs and separate_reasoning (not for hosted APIs).",
)
_MCP = flags.DEFINE_string(
    "mcp", "stdio", "Marketing MCP service: stdio, inprocess, an http(s) URL, or none."
)
_OUT = flags.DEFINE_string(
    "out", "runs/agent/trajectories.jsonl", "Where trajectories are written (JSONL)."
)
_ROUNDS = flags.DEFINE_integer("max_rounds", 4, "Model rounds per request.")
_BUDGET = flags.DEFINE_float("budget_s", 10.0, "Time budget per request (seconds).")
_TOOL_TIMEOUT = flags.DEFINE_float("tool_timeout_s", 5.0, "Timeout per tool call (seconds).")


def _comments(world: livestream.World) -> list[hx.Comment]:
    if _COMMENT.value is not None:
        viewer = world.viewers.get(_VIEWER.value, {})
        return [
            hx.Comment(
                text=_COMMENT.value, viewer_id=_VIEWER.value, handle=viewer.get("handle", "")
            )
        ]
    if _FILE.value is None:
        raise app.UsageError("give --comment or --comments_file")
    lines = [
        x for x in pathlib.Path(_FILE.value).read_text(encoding="utf-8").splitlines() if x.strip()
    ]
    if _FILE.value.endswith(".jsonl"):
        return [hx.Comment(**json.loads(x)) for x in lines]
    return [hx.Comment(text=x, viewer_id="guest", ts=float(i)) for i, x in enumerate(lines)]


def _mcp(world_dir: str):
    if _MCP.value == "none":
        return contextlib.nullcontext(None)
    target = {
        "stdio": livestream.marketing_server_params(world_dir),
        "inprocess": livestream.marketing_server(world_dir),
    }.get(_MCP.value, _MCP.value)
    return hx.McpToolset(target, timeout_s=_TOOL_TIMEOUT.value)


def harness_dir(world_dir: str, room: str) -> pathlib.Path:
    """The released Harness of `room` for a world folder: the bundled room's own on the bundled
    world; on another folder, for v0 the folder itself (`hx.load` finds its `harness/`, as
    before rooms), else its Harness folder of the room's name (e.g. `harness_micro/`)."""
    spec, world = livestream.room(room), pathlib.Path(world_dir)
    if world.resolve() == spec.world_dir.resolve():
        return spec.harness_dir
    return world if room == "v0" else world / spec.harness_dir.name


def main(argv):
    del argv
    _logs.quiet()
    world = livestream.load_world(_WORLD.value)
    harness = hx.load(harness_dir(_WORLD.value, _ROOM.value))
    state = hx.HarnessState(harness=harness)
    comments = _comments(world)
    if _MODE.value == "multi":
        groups = hx.group_comments(comments, topics=world.match_products, window_s=_WINDOW.value)
    else:
        groups = [(c,) for c in comments]
    if _POLICY.value == "rules":
        policy = livestream.RuleBasedPolicy(state, world)
    elif _POLICY.value == "jax":
        policy = _policy.jax_from_flags(_JAX)
    else:
        policy = hx.OpenAICompatPolicy(
            base_url=_BASE_URL.value,
            model=_MODEL.value,
            api_key=os.environ.get(_KEY_ENV.value),
            server_extensions=_EXTENSIONS.value,
        )
    limits = hx.Limits(
        max_rounds=_ROUNDS.value, budget_s=_BUDGET.value, tool_timeout_s=_TOOL_TIMEOUT.value
    )
    sampling = hx.SamplingParams(
        temperature=_TEMPERATURE.value,
        max_tokens=_MAX_TOKENS.value,
        enable_thinking=_THINKING.value,
    )
    trajectories, history = [], []
    with _mcp(_WORLD.value) as mcp:
        tools = livestream.builtin_toolbox(world)
        if mcp is not None:
            tools = tools.merged(hx.bind_mcp_tools(state, "marketing", mcp))
        print(
            f"Room {_ROOM.value}: Harness {harness.name} {harness.release} ({harness.version}); "
            f"tools: {sorted(tools)}"
        )
        session = hx.Session()  # side-effect limits per viewer hold across the whole run
        for i, group in enumerate(groups):
            request = world.make_request(
                group, mode=_MODE.value, history=history, request_id=f"req-{i}"
            )
            traj = hx.run_agent(
                state, request, policy, tools, limits=limits, sampling=sampling, session=session
            )
            trajectories.append(traj)
            who = ", ".join(f"@{c.handle}" for c in traj_comments(traj))
            print(f"[{who}] {' / '.join(c.text for c in group)}")
            print(f"  spoken: {traj.spoken or '(nothing said)'}")
            if traj.final.private:
                print(f"  private to {traj.final.private_to}: {traj.final.private}")
            history.append(
                {"handle": group[0].handle, "comment": group[0].text, "reply": traj.spoken or ""}
            )
    path = hx.write_trajectories(_OUT.value, trajectories)
    print(f"{len(trajectories)} trajectories written to {path}")
    if isinstance(policy, hx.OpenAICompatPolicy):
        print(f"policy endpoint: {policy.stats.to_dict()}")


def traj_comments(traj: hx.Trajectory) -> list[hx.Comment]:
    return [hx.Comment(**c) for c in traj.request["comments"]]


if __name__ == "__main__":
    app.run(main)
