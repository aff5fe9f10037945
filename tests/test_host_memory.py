"""`hat_jax.host_memory`: with freed memory retained, a jitted step that allocates a large
output no longer page-faults it back in on every call (measured in fresh processes)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from hat_jax import host_memory

_PROBE = """
import json, resource, sys
from hat_jax.host_memory import retain_freed_memory
applied = retain_freed_memory({enable})
import jax, jax.numpy as jnp
x = jnp.ones((16 * 2**20,), jnp.float32)  # 64 MiB: above glibc's default mmap threshold
double = jax.jit(lambda x: x * 2.0)
faults = []
for _ in range(32):  # the heap settles after a few calls (measured: 1 to 11)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = jax.block_until_ready(double(x))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del y
print(json.dumps({{"applied": applied, "faults": min(faults)}}))
"""


def _probe(enable: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != host_memory.ENV}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(enable=enable)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc malloc's",
)
def test_retained_memory_removes_the_per_call_page_faults():
    without, with_ = _probe(False), _probe(True)
    assert not without["applied"] and with_["applied"]
    pages = 64 * 2**20 // 4096
    assert without["faults"] > pages // 2, without  # the output's pages, faulted every call
    assert with_["faults"] < pages // 20, with_


def test_the_environment_variable_decides_and_bad_values_are_named(monkeypatch):
    monkeypatch.setenv(host_memory.ENV, "0")
    assert host_memory.retain_freed_memory() is False
    monkeypatch.setenv(host_memory.ENV, "maybe")
    with pytest.raises(ValueError, match="HAT_JAX_RETAIN_HOST_MEMORY must be 1, 0 or auto"):
        host_memory.retain_freed_memory()
