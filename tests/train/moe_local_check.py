"""The shard-local and expert-parallel MoE dispatches on 8 CPU devices against the dispatch
on one device.

Run as a program (`python -m tests.train.moe_local_check`) by `test_moe_local.py`, in its own
process with XLA's classic CPU runtime (see `qwen_mesh_check.py` for why). Prints one JSON
line: per case, the largest value and gradient differences and the specs used.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

import models
from hat_jax import sharding

LAYOUTS = (dict(fsdp=8), dict(fsdp=2, expert=2, tensor=2), dict(data=2, expert=4))
DISPATCHES = {
    "sorted": functools.partial(models.sorted_experts, block_size=8),
    "gathered": functools.partial(models.gathered_experts, block_size=8),
    "dense": models.dense_experts,
    "ragged": models.ragged_experts,
    "capacity": functools.partial(
        models.capacity_experts, capacity_factor=1.0, block_size=8, num_experts=16
    ),
}
EXPERT_NAMES = (("expert", "embed", None, "expert_mlp"), ("expert", "expert_mlp", "embed"))


def _inputs(tokens=256, hidden=16, experts=16, ffn=8, top_k=4):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(tokens, hidden)), jnp.float32)
    logits = rng.normal(size=(tokens, experts))
    logits[: tokens // 2, :3] += 4.0  # skewed: half the tokens prefer the first devices' experts
    idx = jnp.asarray(np.argsort(-logits, axis=1)[:, :top_k], jnp.int32)
    weights = jnp.asarray(rng.uniform(size=(tokens, top_k)), jnp.float32)
    gate_up = jnp.asarray(rng.normal(size=(experts, hidden, 2, ffn)) * 0.3, jnp.float32)
    down = jnp.asarray(rng.normal(size=(experts, ffn, hidden)) * 0.3, jnp.float32)
    return x, idx, weights, gate_up, down


def _loss(run, dispatch, idx, x, w, gu, dn):
    y = run(dispatch, x, idx, w, gu, dn)
    return jnp.sum(y * jnp.cos(y)), y


def _compare(got, want):
    (_, y), grads = got
    (_, y_ref), grads_ref = want
    return {
        "value": float(jnp.abs(y - y_ref).max()),
        "grads": [float(jnp.abs(g - w).max() / jnp.abs(w).max())
                  for g, w in zip(grads, grads_ref, strict=True)],
    }  # fmt: skip


def main() -> None:
    x, idx, weights, gate_up, down = _inputs()
    grad = jax.value_and_grad(_loss, argnums=(3, 4, 5, 6), has_aux=True)
    single = lambda dispatch, *a: dispatch(*a)  # noqa: E731
    want = jax.jit(lambda *a: grad(single, DISPATCHES["dense"], idx, *a))(x, weights, gate_up, down)
    out = {}
    for layout in LAYOUTS:
        mesh = sharding.make_mesh(sharding.MeshConfig(**layout))
        name = ",".join(f"{k}{v}" for k, v in layout.items())
        spec = sharding.batch_spec(mesh, 2)
        placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, weights)]
        experts = [
            jax.device_put(a, NamedSharding(mesh, sharding.logical_to_spec(
                names, sharding.PARAM_RULES, mesh, a.shape)))
            for a, names in zip((gate_up, down), EXPERT_NAMES, strict=True)
        ]  # fmt: skip
        with sharding.use_rules(sharding.ACTIVATION_RULES, mesh):
            tokens = str(sharding.local_spec(("moe_tokens", None), x.shape))
            group = sharding.local_axes(("moe_experts", None, None, None), gate_up.shape)
        cases = [("shard_local", "sorted", models.shard_local_experts)]
        cases += [("expert_parallel", d, models.expert_parallel_experts) for d in DISPATCHES]
        for kind, dispatch, run in cases:

            def step(*a, mesh=mesh, run=run, dispatch=dispatch):
                with sharding.use_rules(sharding.ACTIVATION_RULES, mesh):
                    return grad(run, DISPATCHES[dispatch], idx, *a)

            got = jax.jit(step)(*placed, *experts)
            out[f"{name}/{kind}/{dispatch}"] = {
                "tokens": tokens,
                "expert_group": list(group),
                "weights": str(experts[0].sharding.spec),
                **_compare(got, want),
            }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
