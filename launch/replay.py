"""The deployment replay: complete agent episodes against an OpenAI-compatible endpoint.

  python -m serve.server --checkpoint runs/demo/export/hf &                        # or SGLang
  python -m launch.replay --endpoint http://127.0.0.1:8000/v1 --model hf --out runs/replay/demo
  python -m launch.replay ... --cases runs/replay/cases/t1-dev --concurrency 1,2,4,8 \
      --warmup 10 --requests 100 --slo_s 15

The cases are a stored set of agent items (default: T1's dev split, built once under
`runs/replay/cases`, `runs/replay/cases-<room>` for another room; the folder's manifest is its
version). The episodes run the released Harness of the cases' live room (their manifest's,
"v0" for a set that names none); `--room` must agree with it, and picks the room of the
default cases. Writes `requests.jsonl`, `summary.json`, `manifest.json` (the room included) and
`latency.png` under `--out` (see `serve.replay`) and prints one line per concurrency level.
The manifest records the checkpoint digest the server reports serving (`serve.digest`; our
server and SGLang's `model_path` report one), which the release gates compare with the
candidate's; `--checkpoint`, when given, must have that digest or the replay does not start.
"""

import json
import os
import pathlib

from absl import app, flags

from hat_jax import eval as hev
from hat_jax import harness as hx
from hat_jax import livestream
from launch import _logs

_ENDPOINT = flags.DEFINE_string("endpoint", None, "The API root, e.g. http://127.0.0.1:8000/v1.")
_MODEL = flags.DEFINE_string("model", None, "The model name the server serves.")
_CASES = flags.DEFINE_string("cases", None, "A stored set of agent items (default: T1 dev).")
_CASE_COUNT = flags.DEFINE_integer("case_count", 20, "Items of the default T1 dev cases.")
_OUT = flags.DEFINE_string("out", "runs/replay/run", "Output folder.")
_LEVELS = flags.DEFINE_list("concurrency", ["1", "2", "4", "8"], "Episodes in flight per level.")
_WARMUP = flags.DEFINE_integer("warmup", 10, "Warm-up requests per level (not counted).")
_REQUESTS = flags.DEFINE_integer("requests", 100, "Measured requests per level.")
_SLO = flags.DEFINE_float("slo_s", 15.0, "The latency objective of the attainment figure.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature of every call.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Token budget per model call.")
_THINKING = flags.DEFINE_bool("enable_thinking", True, "Ask the policy for reasoning.")
_SEED = flags.DEFINE_integer("seed", 0, "Base seed (request k sends seed + its case index).")
_TIMEOUT = flags.DEFINE_float("request_timeout_s", 120.0, "HTTP timeout of one model call.")
_EXTENSIONS = flags.DEFINE_bool(
    "server_extensions", True, "Send chat_template_kwargs / separate_reasoning (SGLang, ours)."
)
_KEY_ENV = flags.DEFINE_string("api_key_env", "OPENAI_API_KEY", "Variable holding the API key.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None,
    "The checkpoint the server should serve: its digest must be the one the server reports.",
)  # fmt: skip
_ROOM = flags.DEFINE_enum(
    "room", None, list(livestream.ROOMS),
    "The live room (default: the cases' own; v0 for the default cases); must match the cases.",
)  # fmt: skip


def default_cases_dir(room: str) -> str:
    """Where the default cases (T1 dev) of a room are built: one folder per room."""
    return "runs/replay/cases" if room == "v0" else f"runs/replay/cases-{room}"


def cases_and_context() -> tuple[hev.EvalSet, hev.EvalContext]:
    """The case set and the evaluation context of its live room (`--cases` and `--room`)."""
    from serve import replay as rp

    if _CASES.value:
        cases = rp.load_cases(_CASES.value)
        try:
            room = rp.cases_room(cases, _ROOM.value)
        except ValueError as err:
            raise app.UsageError(f"--room={_ROOM.value}: {err}") from None
        return cases, hev.EvalContext.default(room)
    ctx = hev.EvalContext.default(_ROOM.value or "v0")
    cases = hev.ensure_set("t1", ctx, sets_dir=default_cases_dir(ctx.room), split="dev",
                           size=_CASE_COUNT.value)  # fmt: skip
    return cases, ctx


def main(argv):
    del argv
    _logs.quiet()
    from serve import replay as rp

    if not _ENDPOINT.value or not _MODEL.value:
        raise app.UsageError("--endpoint and --model are required")
    try:
        levels = tuple(int(x) for x in _LEVELS.value)
    except ValueError:
        raise app.UsageError(f"--concurrency takes integers, got {_LEVELS.value}") from None
    cases, ctx = cases_and_context()
    config = rp.ReplayConfig(
        concurrency=levels, warmup=_WARMUP.value, requests=_REQUESTS.value, slo_s=_SLO.value,
        sampling=hx.SamplingParams(temperature=_TEMPERATURE.value, max_tokens=_MAX_TOKENS.value,
                                   enable_thinking=_THINKING.value, seed=_SEED.value),
        request_timeout_s=_TIMEOUT.value, server_extensions=_EXTENSIONS.value,
    )  # fmt: skip
    summary = rp.replay(
        cases, ctx, endpoint=_ENDPOINT.value, model=_MODEL.value, run_dir=_OUT.value,
        config=config, checkpoint=_CHECKPOINT.value, api_key=os.environ.get(_KEY_ENV.value),
    )  # fmt: skip
    print(f"cases {cases.version} ({len(cases)} items) in the {ctx.room} room "
          f"(Harness {ctx.harness.version}); results in {_OUT.value}")  # fmt: skip
    manifest = json.loads((pathlib.Path(_OUT.value) / rp.MANIFEST_FILE).read_text())
    print(f"served checkpoint: {manifest.get('checkpoint_digest') or 'not reported by the server'}")
    for level, s in summary["levels"].items():
        p50 = s["latency_p50_s"]
        print(
            f"concurrency {level}: success {s['success_rate']:.2f}, attainment@{s['slo_s']:g}s "
            f"{s['attainment']:.2f}, latency p50 {p50 if p50 is None else round(p50, 2)} s, "
            f"p95 {s['latency_p95_s'] and round(s['latency_p95_s'], 2)} s, ttft p50 "
            f"{s['ttft_p50_s'] and round(s['ttft_p50_s'], 2)} s, decode "
            f"{s['decode_tokens_per_s'] and round(s['decode_tokens_per_s'], 1)} tok/s"
        )


if __name__ == "__main__":
    app.run(main)
