"""Running a check module in a subprocess with 8 fake CPU devices (the mesh tests)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_on_eight_devices(module: str, *args: str, timeout: int = 1500) -> str:
    """Runs `python -m module args...` on 8 fake CPU devices (XLA's classic CPU runtime) and
    returns its stdout; a failing run fails the test with the end of its stderr."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 --xla_cpu_use_thunk_runtime=false"
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
