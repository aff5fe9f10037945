"""The shard-local MoE dispatch on 8 CPU devices against the dispatch on one device.

Run as a program (`python -m tests.train.moe_local_check`) by `test_moe_local.py`, in its own
process with XLA's classic CPU runtime (see `qwen_mesh_check.py` for why). Prints one JSON
line: the largest value and gradient differences, and the specs `local_map` used.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import models
from hat_jax import sharding


def _inputs(tokens=256, hidden=16, experts=8, ffn=8, top_k=2):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(tokens, hidden)), jnp.float32)
    logits = rng.normal(size=(tokens, experts))
    idx = jnp.asarray(np.argsort(-logits, axis=1)[:, :top_k], jnp.int32)
    weights = jnp.asarray(rng.uniform(size=(tokens, top_k)), jnp.float32)
    gate_up = jnp.asarray(rng.normal(size=(experts, hidden, 2, ffn)) * 0.3, jnp.float32)
    down = jnp.asarray(rng.normal(size=(experts, ffn, hidden)) * 0.3, jnp.float32)
    return x, idx, weights, gate_up, down


def main() -> None:
    x, idx, weights, gate_up, down = _inputs()
    dispatch = lambda *a: models.sorted_experts(*a, block_size=8)  # noqa: E731

    def loss(run, x, w, gu, dn):
        y = run(dispatch, x, idx, w, gu, dn)
        return jnp.sum(y * jnp.cos(y)), y

    def single(fn, *a):
        return fn(*a)

    grad = jax.value_and_grad(loss, argnums=(1, 2, 3, 4), has_aux=True)
    (_, want), want_grads = jax.jit(lambda *a: grad(single, *a))(x, weights, gate_up, down)
    out = {}
    for layout in (dict(fsdp=8), dict(fsdp=2, expert=2, tensor=2)):
        mesh = sharding.make_mesh(sharding.MeshConfig(**layout))
        spec = sharding.batch_spec(mesh, 2)
        placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, weights)]
        experts = [jax.device_put(a, NamedSharding(mesh, PartitionSpec("expert")))
                   for a in (gate_up, down)]  # fmt: skip

        def step(*a, mesh=mesh):
            with sharding.use_rules(sharding.ACTIVATION_RULES, mesh):
                return grad(models.shard_local_experts, *a)

        with sharding.use_rules(sharding.ACTIVATION_RULES, mesh):
            used = sharding.local_spec(("moe_tokens", None), x.shape)
        (_, got), got_grads = jax.jit(step)(*placed, *experts)
        name = ",".join(f"{k}{v}" for k, v in layout.items())
        out[name] = {
            "spec": str(used),
            "value": float(jnp.abs(got - want).max()),
            "grads": [
                float(jnp.abs(g - w).max() / jnp.abs(w).max())
                for g, w in zip(got_grads, want_grads, strict=True)
            ],  # fmt: skip
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
