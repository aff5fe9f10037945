"""Test-wide setup: 8 fake CPU devices for sharding tests, and the `accelerator` marker.

`XLA_FLAGS` must be set before JAX initialises its backends, so this runs at conftest import,
before any test module imports jax. The test process runs hundreds of unrelated programs, so
it does not keep freed host memory at its peak as a training process does
(`hat_jax.host_memory`; tests that check that setting pass it explicitly).

Compiled programs are kept in JAX's persistent compilation cache under `.pytest_cache/jax`
(`JAX_COMPILATION_CACHE_DIR`, inherited by the subprocesses the tests start), so the test
processes do not each compile the same tiny-model programs again; a fresh clone starts empty.
"""

import json
import os
import pathlib

os.environ.setdefault("HAT_JAX_RETAIN_HOST_MEMORY", "0")
# torch (transformers' reference models the parity tests compare against) runs on one thread:
# its OpenMP workers spin while they wait, and with the cores shared by several test processes
# a tiny reference model's `generate` took 4-19 s of CPU on 2 threads and 0.3 s on one. Set
# before anything imports torch; inherited by the subprocesses the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).parents[1] / ".pytest_cache" / "jax")
)

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ["pytester"]


def pytest_report_header(config):
    return f"jax {jax.__version__}: backend={jax.default_backend()}, devices={jax.device_count()}"


# Seconds each test module took in a measured run (`make test PYTEST_ARGS=--record-durations=
# tests/durations.json` rewrites it). Only the order of modules depends on it.
_DURATIONS = pathlib.Path(__file__).parent / "durations.json"


def pytest_addoption(parser):
    parser.addoption("--record-durations", default="", metavar="PATH",
                     help="write the seconds each test module took (all phases) to PATH")  # fmt: skip


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _slowest_modules_first(items):
    """Order the modules by the seconds they took in the measured run (`tests/durations.json`;
    a module not in it counts a second a test), the longest first, keeping the order inside
    each module. Test processes (`--dist loadscope --no-loadscope-reorder`) take whole modules
    in this order, so the long ones (process kill, several processes, the pipeline) start at
    once rather than at the end, where one process would run them alone while the others
    idle (xdist's own reordering puts the modules with the most tests first)."""
    measured = json.loads(_DURATIONS.read_text()) if _DURATIONS.is_file() else {}
    count: dict[str, int] = {}
    for item in items:
        count[_module(item.nodeid)] = count.get(_module(item.nodeid), 0) + 1
    rank = {m: i for i, m in enumerate(sorted(count, key=lambda m: -measured.get(m, count[m])))}
    items.sort(key=lambda item: rank[_module(item.nodeid)])  # stable: the order in a module


_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _seconds[_module(report.nodeid)] = _seconds.get(_module(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--record-durations")
    if path and not hasattr(session.config, "workerinput"):  # the controller has every report
        out = {m: round(s, 1) for m, s in sorted(_seconds.items(), key=lambda kv: -kv[1])}
        tmp = pathlib.Path(f"{path}.tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(path)


def pytest_collection_modifyitems(config, items):
    _slowest_modules_first(items)
    backend = jax.default_backend()
    if backend != "cpu":
        return
    skip = pytest.mark.skip(reason=f"needs a GPU or TPU; this run has only jax backend '{backend}'")
    for item in items:
        if "accelerator" in item.keywords:
            item.add_marker(skip)
