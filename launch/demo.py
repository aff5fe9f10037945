"""`make demo`: the main job on the embedded default (tiny model, bundled data and Harness).

Runs, in order, every HAT stage that exists so far and writes `runs/demo/report.md`, which
says what ran, how long it took and where its outputs are. Usage:

  python -m launch.demo [--workdir runs/demo]
"""

import os
import pathlib
import platform
import time

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "Where the demo writes its outputs.")


def _environment(workdir: pathlib.Path) -> list[str]:
    import jax

    return [
        f"python {platform.python_version()}, jax {jax.__version__}",
        f"backend {jax.default_backend()}, {jax.device_count()} device(s)",
    ]


# (name, function(workdir) -> report lines). Stages are appended here as they land.
STAGES = [("environment", _environment)]


def _write_atomic(path: pathlib.Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv):
    del argv
    workdir = pathlib.Path(_WORKDIR.value)
    workdir.mkdir(parents=True, exist_ok=True)
    report = ["# hat-jax demo report", ""]
    for name, stage in STAGES:
        print(f"[demo] stage {name} ...", flush=True)
        start = time.perf_counter()
        lines = stage(workdir)
        seconds = time.perf_counter() - start
        report += [f"## {name} ({seconds:.1f} s)", "", *[f"- {line}" for line in lines], ""]
        print(f"[demo] stage {name} done in {seconds:.1f} s", flush=True)
    _write_atomic(workdir / "report.md", "\n".join(report))
    print(f"[demo] report: {workdir / 'report.md'}")


if __name__ == "__main__":
    app.run(main)
