"""The shard-local (`models.shard_local_experts`) and expert-parallel
(`models.expert_parallel_experts`) MoE dispatches over `hat_jax.sharding.local_map` equal the
dispatch on one device, values and gradients, with the tokens split over 8 devices and the
experts stored as `PARAM_RULES` lay them out (see `moe_local_check.py`; run in a subprocess
under XLA's classic CPU runtime)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

import models
from hat_jax import sharding
from tests._devices import run_on_eight_devices


def test_local_map_without_a_mesh_calls_the_function():
    x = jnp.arange(12.0).reshape(6, 2)
    run = sharding.local_map(lambda a: a * 2, [("moe_tokens", None)], ("moe_tokens", None))
    assert sharding.local_spec(("moe_tokens", None)) is None
    assert (run(x) == x * 2).all()


def test_sampling_rules_keep_the_moe_tokens_whole():
    assert dict(sharding.SAMPLING_RULES)["moe_tokens"] is None
    assert dict(sharding.SAMPLING_RULES)["moe_experts"] is None
    assert set(dict(sharding.ACTIVATION_RULES)["moe_tokens"]) == set(sharding.MESH_AXES)
    # the expert-parallel dispatch computes experts where PARAM_RULES stores them
    assert dict(sharding.ACTIVATION_RULES)["moe_experts"] == dict(sharding.PARAM_RULES)["expert"]


def test_expert_parallel_without_a_mesh_is_the_dispatch():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(40, 8)), jnp.float32)
    idx = jnp.asarray(np.argsort(rng.random((40, 4)), 1)[:, :2], jnp.int32)
    w = jnp.asarray(rng.random((40, 2)), jnp.float32)
    gate_up = jnp.asarray(rng.normal(size=(4, 8, 2, 6)), jnp.float32)
    down = jnp.asarray(rng.normal(size=(4, 6, 8)), jnp.float32)
    want = models.dense_experts(x, idx, w, gate_up, down)
    got = models.expert_parallel_experts(models.dense_experts, x, idx, w, gate_up, down)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_shard_local_dispatch_equals_one_device():
    stdout = run_on_eight_devices("tests.train.moe_local_check", timeout=600)
    results = json.loads(stdout.strip().splitlines()[-1])
    kinds = {name.split("/", 1)[1] for name in results}
    assert kinds == {"shard_local/sorted"} | {
        f"expert_parallel/{d}" for d in ("sorted", "gathered", "dense", "ragged", "capacity")
    }
    assert "'fsdp'" in results["fsdp8/shard_local/sorted"]["tokens"]
    mixed = results["fsdp2,expert2,tensor2/expert_parallel/gathered"]
    assert all(a in mixed["tokens"] for a in ("fsdp", "expert", "tensor"))
    # experts split over expert x fsdp (4 groups of 4), stored and computed alike
    assert mixed["expert_group"] == ["expert", "fsdp"] and "('expert', 'fsdp')" in mixed["weights"]
    assert results["data2,expert4/expert_parallel/ragged"]["expert_group"] == ["expert"]
    for name, r in results.items():
        assert r["value"] < 1e-5, (name, r)
        assert max(r["grads"]) < 1e-5, (name, r)
