"""The accelerator check: one prepared run (at most 10 minutes on one GPU) of what a CPU
cannot show, printed as one table.

  python -m launch.accelerator_check --dry_run          # on any machine: the plan
  python -m launch.accelerator_check --export runs/demo/export/hf --out runs/accel

Steps (each a subprocess with its own time limit; a failed step is reported and the rest run):
1. `logits`: the tiny model's logits on the accelerator against the CPU's (fp32, one process
   with both backends; the maximum absolute difference is printed).
2. `train_step`: `python -m bench model` (the bench config's train step; MFU and the ratio to
   transformers measured in the same run).
3. `decode`: `python -m bench decode` (tokens/s, speculative vs plain).
4. `sglang` and `sglang_mtp`: the export served by SGLang without and with NextN MTP
   (`serve.sglang`), each with a short deployment replay (`launch.replay`, concurrency 1 and 4,
   2 warm-ups, 10 requests) and its acceptance length.

Needs the accelerator, serving and benchmark extras (`pip install -e ".[cuda,serve,bench]"`);
`--install` runs that first. On a machine without an accelerator only `--dry_run` is meaningful: it
prints each step's command and its time limit and exits 0.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys
import time

from absl import app, flags

_DRY = flags.DEFINE_bool("dry_run", False, "Print the plan and exit.")
_EXPORT = flags.DEFINE_string("export", "runs/demo/export/hf", "The HF export to serve.")
_OUT = flags.DEFINE_string("out", "runs/accelerator_check", "Logs and results.")
_INSTALL = flags.DEFINE_bool("install", False, "pip install the cuda and serve extras first.")
_PORT = flags.DEFINE_integer("port", 30000, "SGLang's port.")

_LOGITS = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import models
accel = [d for d in jax.devices() if d.platform != "cpu"]
assert accel, "no accelerator visible to JAX"
config = models.QwenConfig.preset("tiny", moe_dispatch="dense")
ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 256)).astype(np.int32)
out = {}
for device in (jax.devices("cpu")[0], accel[0]):
    with jax.default_device(device):
        model = models.Qwen(config, rngs=nnx.Rngs(0))
        out[device.platform] = np.asarray(model(jnp.asarray(ids)).logits, np.float32)
diff = float(np.abs(out["cpu"] - out[accel[0].platform]).max())
print(f"RESULT max |logits gpu - cpu| = {diff:.3g} over {ids.size} tokens")
assert diff < 1e-3, diff
"""


@dataclasses.dataclass
class Step:
    name: str
    command: list[str]
    limit_s: int
    result: str = "not run"
    seconds: float = 0.0


def _plan(export: str, port: int) -> list[Step]:
    py = sys.executable
    served = f"http://127.0.0.1:{port}/v1"
    replay = [py, "-m", "launch.replay", f"--endpoint={served}", "--model=hat",
              "--concurrency=1,4", "--warmup=2", "--requests=10"]  # fmt: skip
    steps = [
        Step("logits", [py, "-c", _LOGITS], 90),
        Step("train_step", [py, "-m", "bench", "model"], 120),
        Step("decode", [py, "-m", "bench", "decode"], 90),
    ]
    for name, speculative in (("sglang", "off"), ("sglang_mtp", "on")):
        serve = [py, "-m", "serve.sglang", f"--model_path={export}", f"--port={port}",
                 "--served_model_name=hat", f"--speculative={speculative}",
                 "--timeout_s=100"]  # fmt: skip
        steps.append(Step(name, ["__serve_and_replay__", json.dumps([serve, replay])], 150))
    return steps


def _run(step: Step, out: pathlib.Path) -> None:
    log = out / f"{step.name}.log"
    start = time.perf_counter()
    try:
        if step.command[0] == "__serve_and_replay__":
            serve, replay = json.loads(step.command[1])
            step.result = _serve_and_replay(serve, replay + [f"--out={out / step.name}"], log,
                                            step.limit_s)  # fmt: skip
        else:
            done = subprocess.run(step.command, capture_output=True, text=True,
                                  timeout=step.limit_s)  # fmt: skip
            log.write_text(done.stdout + done.stderr)
            lines = [x for x in done.stdout.splitlines() if x.strip()]
            ok = done.returncode == 0
            step.result = ("ok: " if ok else f"FAILED ({done.returncode}): ") + (
                lines[-1][:120] if lines else ""
            )
    except subprocess.TimeoutExpired:
        step.result = f"FAILED: over {step.limit_s} s"
    step.seconds = time.perf_counter() - start


def _serve_and_replay(serve: list[str], replay: list[str], log: pathlib.Path, limit: int) -> str:
    from serve.sglang import SGLangServer

    command = subprocess.run(serve + ["--dry_run"], capture_output=True, text=True, timeout=60)
    if command.returncode != 0:
        return f"FAILED: {command.stderr.strip().splitlines()[-1][:160]}"
    sglang = command.stdout.strip().splitlines()[-1].split()
    port = next(a.split("=")[1] for a in serve if a.startswith("--port="))
    server = SGLangServer(sglang, f"http://127.0.0.1:{port}", log)
    with server.start(timeout_s=limit * 2 / 3):
        done = subprocess.run(replay, capture_output=True, text=True, timeout=limit / 3)
        accept = server.server_info().get("spec_accept_length")
    last = [x for x in done.stdout.splitlines() if x.startswith("concurrency")]
    return (
        ("ok: " if done.returncode == 0 else "FAILED: ")
        + " | ".join(last)[:200]
        + (f" | acceptance {accept:.2f}" if accept else "")
    )


def main(argv):
    del argv
    steps = _plan(_EXPORT.value, _PORT.value)
    if _DRY.value:
        print(f"accelerator check plan ({sum(s.limit_s for s in steps)} s of limits in all):")
        for s in steps:
            if s.name == "logits":
                shown = f"{s.command[0]} -c <the logits check in this module>"
            elif s.command[0] == "__serve_and_replay__":
                serve, replay = json.loads(s.command[1])
                shown = f"{' '.join(serve[1:])}; then {' '.join(replay[1:])}"
            else:
                shown = " ".join(s.command)
            print(f"- {s.name} (limit {s.limit_s} s): {shown}")
        return
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    if _INSTALL.value:
        subprocess.run([sys.executable, "-m", "pip", "install", "-e", ".[cuda,serve,bench]"],
                       check=True)  # fmt: skip
    for step in steps:
        _run(step, out)
        print(f"{step.name:<11} {step.seconds:7.1f} s  {step.result}", flush=True)
    (out / "results.json").write_text(json.dumps([dataclasses.asdict(s) for s in steps], indent=1))


if __name__ == "__main__":
    app.run(main)
