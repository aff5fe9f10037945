"""The shard-local MoE dispatch (`models.shard_local_experts` over `hat_jax.sharding.local_map`)
equals the dispatch on one device, values and gradients, with the tokens split over 8 devices
(see `moe_local_check.py`; run in a subprocess under XLA's classic CPU runtime)."""

import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import pytest

import models
from hat_jax import sharding

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_local_map_without_a_mesh_calls_the_function():
    x = jnp.arange(12.0).reshape(6, 2)
    run = sharding.local_map(lambda a: a * 2, [("moe_tokens", None)], ("moe_tokens", None))
    assert sharding.local_spec(("moe_tokens", None)) is None
    assert (run(x) == x * 2).all()


def test_sampling_rules_keep_the_moe_tokens_whole():
    assert dict(sharding.SAMPLING_RULES)["moe_tokens"] is None
    assert set(dict(sharding.ACTIVATION_RULES)["moe_tokens"]) == set(sharding.MESH_AXES)


@pytest.mark.slow
def test_shard_local_dispatch_equals_one_device():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 --xla_cpu_use_thunk_runtime=false"
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.train.moe_local_check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "fsdp8" in results and "'fsdp'" in results["fsdp8"]["spec"]
    assert all(a in results["fsdp2,expert2,tensor2"]["spec"] for a in ("fsdp", "expert", "tensor"))
    for name, r in results.items():
        assert r["value"] < 1e-5, (name, r)
        assert max(r["grads"]) < 1e-5, (name, r)
    assert models.shard_local_experts is not None
