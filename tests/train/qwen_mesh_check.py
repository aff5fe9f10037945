"""Loss and gradients of one SFT step of the tiny `models.Qwen` on several meshes.

Run as a program (`python -m tests.train.qwen_mesh_check OUT_DIR`) by
`test_qwen_sharded.py`, in its own process: it needs 8 CPU devices and XLA's classic CPU
runtime (`--xla_cpu_use_thunk_runtime=false`), because the thunk runtime of this jaxlib can
deadlock a multi-device CPU program whose devices wait in a collective (seen with this model
on a 2-core machine). Writes `<layout>.npz` with the loss, metrics and flattened gradient.
"""

import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import models
from hat_jax import sharding, train

LAYOUTS = {
    "reference": (dict(fsdp=1), 1, 1),
    "fsdp8": (dict(fsdp=8), 8, 1),
    "fsdp2_tensor4": (dict(fsdp=2, tensor=4), 8, 1),
    "expert4_fsdp2": (dict(fsdp=2, expert=4), 8, 1),
    "fsdp2_tensor4_local": (dict(fsdp=2, tensor=4), 8, 1),
    "expert4_fsdp2_local": (dict(fsdp=2, expert=4), 8, 1),
    "fsdp8_ep": (dict(fsdp=8), 8, 1),
    "fsdp2_tensor4_ep": (dict(fsdp=2, tensor=4), 8, 1),
}  # micro-batch accumulation runs the same code as in test_step.py (toy model, 8 devices)

# Layouts that also run the production kernels: the shard-local MoE dispatch (each device
# sorts its own tokens, moe_tokens split over every mesh axis) and flash attention.
LOCAL = dict(moe_shard_local=True, attention_impl="flash", attention_block_size=32)
# ... and the expert-parallel dispatch of the production config (experts computed where they
# are stored, tokens gathered over the expert group, outputs reduce-scattered).
EXPERT_PARALLEL = dict(moe_expert_parallel=True, attention_impl="flash", attention_block_size=32)


def _keep_gradient():
    return optax.GradientTransformation(
        init=lambda params: jax.tree.map(jnp.zeros_like, params),
        update=lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
    )


def run(layout: str, params, config, batch, out: pathlib.Path) -> None:
    mesh_sizes, devices, micro = LAYOUTS[layout]
    mesh = sharding.make_mesh(sharding.MeshConfig(**mesh_sizes), devices=jax.devices()[:devices])
    if layout.endswith("_local"):
        config = config.replace(**LOCAL)
    if layout.endswith("_ep"):
        config = config.replace(**EXPERT_PARALLEL)
    model_fn = lambda: models.Qwen(config, rngs=nnx.Rngs(0))  # noqa: E731
    graphdef, abs_params, abs_rest = train.abstract_split(model_fn, mesh)
    optimizer = _keep_gradient()
    abstract = train.abstract_train_state(abs_params, abs_rest, optimizer, mesh)
    placed = jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), params, abs_params)
    model = nnx.merge(graphdef, placed, jax.tree.map(lambda a: a, abs_rest))
    _, state = train.init_train_state(model, optimizer, mesh, seed=0)
    step = train.make_train_step(
        functools.partial(train.sft_loss, aux_loss_coef=0.0, logits_chunk=48),
        graphdef=graphdef,
        optimizer=optimizer,
        state_shardings=sharding.shardings_of(abstract),
        batch_shardings=train.batch_shardings_for(mesh),
        micro_batches=micro,
        donate=False,
    )
    new, metrics = step(state, sharding.global_batch(batch, mesh))
    grads = [np.asarray(x).ravel() for x in jax.tree.leaves(new.opt_state)]
    sharded = sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(new.params))
    np.savez(out / f"{layout}.npz", grad=np.concatenate(grads), sharded=sharded,
             **{k: np.asarray(v) for k, v in jax.device_get(metrics).items()})  # fmt: skip


def main(out_dir: str, layouts: list[str] | None = None) -> None:
    """Runs `layouts` (default: all of `LAYOUTS`; "reference" is always run first)."""
    out = pathlib.Path(out_dir)
    names = ["reference", *[n for n in (layouts or LAYOUTS) if n != "reference"]]
    unknown = sorted(set(names) - set(LAYOUTS))
    if unknown:
        raise SystemExit(f"unknown layouts {unknown}; known: {list(LAYOUTS)}")
    # The block-loop dispatch (its expert-parallel variant is the memory-lean gathered loop);
    # the capacity grid under a mesh: tests/train/test_moe_local.py.
    config = models.QwenConfig.preset("tiny", moe_dispatch="sorted")
    with nnx.use_eager_sharding(False):
        params = nnx.state(models.Qwen(config, rngs=nnx.Rngs(0)), nnx.Param)
    batch = next(
        train.SyntheticTokenSource(batch_size=8, seq_len=128, vocab_size=config.vocab_size)
    )
    for layout in names:
        run(layout, params, config, batch, out)
        print(json.dumps({"done": layout}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else None)
