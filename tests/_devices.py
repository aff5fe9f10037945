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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(
    args: list[str], processes: int, *, devices: int = 8, env: dict | None = None, log_dir=None
) -> list[subprocess.Popen]:
    """Starts `python args...` as `processes` JAX processes of one job on this machine, as a
    cluster launcher would: a local coordinator in `JAX_COORDINATOR_ADDRESS`, the count and
    each id in `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID`, `devices / processes` fake CPU devices
    each. Output goes to `log_dir/process_<i>.log` (or is discarded)."""
    port = free_port()
    procs = []
    for i in range(processes):
        penv = dict(os.environ) | dict(env or {})
        penv |= {
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices // processes} "
            "--xla_cpu_use_thunk_runtime=false",
            "JAX_PLATFORMS": "cpu",
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "JAX_NUM_PROCESSES": str(processes),
            "JAX_PROCESS_ID": str(i),
        }
        if processes == 1:  # one process: no coordinator, as on a single machine
            for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
                penv.pop(name)
        # No persistent compilation cache: on CPU its key does not tell a program of one
        # process over 8 devices from the same program of 4 processes over 2 devices each
        # (loading one for the other deadlocked the processes in their collectives).
        penv.pop("JAX_COMPILATION_CACHE_DIR", None)
        out = open(pathlib.Path(log_dir) / f"process_{i}.log", "w") if log_dir else None  # noqa: SIM115
        procs.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, env=penv, stdout=out,
                                      stderr=subprocess.STDOUT if out else subprocess.DEVNULL))  # fmt: skip
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """The exit codes of every process; all are killed if any runs past `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_job(args: list[str], processes: int, *, devices: int, log_dir, timeout: float = 900,
            env: dict | None = None) -> float:  # fmt: skip
    """Runs `python args...` as a job of `processes` processes (see `start_processes`), logs
    in `log_dir`, and returns its seconds; any process failing fails the test with the end
    of every process's log."""
    import time

    log_dir = pathlib.Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    procs = start_processes(args, processes, devices=devices, env=env, log_dir=log_dir)
    codes = wait_all(procs, timeout=timeout)
    logs = "\n".join((log_dir / f"process_{i}.log").read_text()[-3000:] for i in range(processes))
    assert codes == [0] * processes, logs
    return time.monotonic() - start
