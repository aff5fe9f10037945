"""Test-wide setup: 8 fake CPU devices for sharding tests, and the `accelerator` marker.

`XLA_FLAGS` must be set before JAX initialises its backends, so this runs at conftest import,
before any test module imports jax. The test process runs hundreds of unrelated programs, so
it does not keep freed host memory at its peak as a training process does
(`hat_jax.host_memory`; tests that check that setting pass it explicitly).

Compiled programs are kept in JAX's persistent compilation cache under `.pytest_cache/jax`
(`JAX_COMPILATION_CACHE_DIR`, inherited by the subprocesses the tests start), so the test
processes do not each compile the same tiny-model programs again; a fresh clone starts empty.
"""

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


def pytest_collection_modifyitems(config, items):
    backend = jax.default_backend()
    if backend != "cpu":
        return
    skip = pytest.mark.skip(reason=f"needs a GPU or TPU; this run has only jax backend '{backend}'")
    for item in items:
        if "accelerator" in item.keywords:
            item.add_marker(skip)
