"""Resume proven by process kill, shared by every stage's kill test: the stage's launch command
run to its end, the same command in another run directory killed (SIGKILL) once that
directory shows a chosen point, then run again to its end; the two metrics files compare
equal but for their clocks, and so do the two final checkpoints' parameters.

The commands run as 1-device CPU processes (the 8 simulated devices of `tests/conftest.py`
are removed from `XLA_FLAGS`) and share the tests' compilation cache. The run to be killed
goes first, alone, so the programs it reaches before the kill are compiled once, into that
cache; the resumed run and the uninterrupted one then go side by side and read them from it
(run beside the killed one, the uninterrupted run compiled them a second time: the CPU, not
the wall clock, bounds the test suite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from hat_jax.checkpoint import restore_params
from hat_jax.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_S = 900
# Figures that are clocks or rates of a clock: they differ between any two runs.
_CLOCK_SUFFIXES = ("seconds", "per_second")
# Figures of the process, not of the run: the sampler programs this process has compiled so far
# (a resumed process has not compiled the held-out evaluation's program of step 0 yet).
_PROCESS_FIGURES = ("sampler_programs",)


def command(stage: str, config: str, run_dir: pathlib.Path, **overrides) -> list[str]:
    """`python -m launch.<stage> --config=<config> --run_dir=... --config.<key>=<value>...`;
    `overrides` keys spell dots as `__` (`trainer__total_steps=4`)."""
    flags = [f"--config.{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    return [sys.executable, "-m", f"launch.{stage}", f"--config={config}",
            f"--run_dir={run_dir}", *flags]  # fmt: skip


def environment() -> dict[str, str]:
    """This process's environment with one CPU device."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]  # fmt: skip
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def committed_steps(run_dir: pathlib.Path) -> list[int]:
    """The steps whose checkpoint is committed (Orbax renames a finished save to its step)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def logged_steps(run_dir: pathlib.Path) -> list[int]:
    """The steps of the complete records of a run's metrics file written so far."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError):  # a record being written
            steps.append(json.loads(line)["step"])
    return steps


def past_a_checkpoint(run_dir: pathlib.Path) -> bool:
    """A checkpoint is committed and a record of a later step is logged."""
    committed, logged = committed_steps(run_dir), logged_steps(run_dir)
    return bool(committed and logged) and max(logged) > committed[-1]


@dataclasses.dataclass(frozen=True)
class Killed:
    """What a killed run's directory held just after the kill."""

    committed: list[int]  # committed checkpoints' steps
    logged: list[int]  # steps of its metrics records


def without_clocks(records: list[dict]) -> list[dict]:
    """The records without their clocks and the figures of the process that wrote them."""

    def kept(name: str) -> bool:
        return name != "time" and not name.endswith(_CLOCK_SUFFIXES + _PROCESS_FIGURES)

    return [{k: v for k, v in r.items() if kept(k)} for r in records]


def _start(cmd: list[str], log: pathlib.Path) -> subprocess.Popen:
    with log.open("w") as out:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            cmd, cwd=REPO, env=environment(), stdout=out, stderr=subprocess.STDOUT
        )


def _finish(proc: subprocess.Popen, log: pathlib.Path, what: str) -> str:
    try:
        rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{what} ran past {TIMEOUT_S} s: {log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert rc == 0, f"{what} exited {rc}: {text[-3000:]}"
    return text


def kill_and_resume(
    tmp_path: pathlib.Path,
    make_command: Callable[[pathlib.Path], list[str]],
    kill_when: Callable[[pathlib.Path], bool],
) -> tuple[pathlib.Path, pathlib.Path, Killed, str]:
    """Runs `make_command(run_dir)` in `tmp_path/killed`, SIGKILL as soon as
    `kill_when(run_dir)` holds (polled every 20 ms), then the same command again there to its
    end and, beside it, straight through in `tmp_path/straight`.

    Returns:
      `(straight, killed)` run directories, what the killed one held when it was killed, and
      the resumed run's output.
    """
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    victim = _start(make_command(killed), tmp_path / "killed.log")
    deadline = time.monotonic() + TIMEOUT_S
    while not kill_when(killed):
        if victim.poll() is not None or time.monotonic() > deadline:
            victim.kill()
            log = (tmp_path / "killed.log").read_text()[-3000:]
            raise AssertionError(f"the run ended before the kill point (rc {victim.returncode}, "
                                 f"committed {committed_steps(killed)}): {log}")  # fmt: skip
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    at_kill = Killed(committed_steps(killed), logged_steps(killed))
    print(f"killed holding checkpoints {at_kill.committed}, records of {at_kill.logged}")
    reference = _start(make_command(straight), tmp_path / "straight.log")
    try:
        resumed = _finish(_start(make_command(killed), tmp_path / "resumed.log"),
                          tmp_path / "resumed.log", "the resumed run")  # fmt: skip
    except BaseException:
        reference.kill()
        raise
    _finish(reference, tmp_path / "straight.log", "the uninterrupted run")
    return straight, killed, at_kill, resumed


def assert_same_metrics(straight: pathlib.Path, killed: pathlib.Path) -> list[dict]:
    """Every record of the two metrics files, every figure but the clocks, exactly equal."""
    a, b = without_clocks(read_metrics(straight)), without_clocks(read_metrics(killed))
    assert [r["step"] for r in b] == [r["step"] for r in a]
    for x, y in zip(a, b, strict=True):
        assert x == y, {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)}
    return a


def assert_same_params(
    straight: pathlib.Path, killed: pathlib.Path, directory: str = "checkpoints"
) -> None:
    """The parameters in the two runs' `directory` (a checkpoints folder: its latest step; or
    a `save_params` folder), bit for bit, and their model configs."""
    a, config_a = restore_params(straight / directory)
    b, config_b = restore_params(killed / directory)
    assert config_a == config_b
    flat_a, flat_b = _flat(a), _flat(b)
    assert sorted(flat_a) == sorted(flat_b)
    for name, value in flat_a.items():
        assert np.array_equal(np.asarray(value), np.asarray(flat_b[name])), name


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict) or hasattr(tree, "items"):
        out = {}
        for k, v in tree.items():
            out |= _flat(v, f"{prefix}{k}/")
        return out
    return {prefix: tree}
