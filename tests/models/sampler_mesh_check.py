"""`models.Sampler` on 8 devices against one device, for both model families.

Run as a program (`python -m tests.models.sampler_mesh_check OUT_DIR`) by
`test_sampler_sharded.py`, in its own process: it needs 8 CPU devices and XLA's classic CPU
runtime (see `tests/_devices.py`). For the Qwen3.5 family (DeltaNet + attention, `tiny`) and
the Qwen3-MoE family (attention only), the same weights sample on one device and, placed by
`PARAM_RULES` as in training, on a (data 2, fsdp 4) mesh: greedy rows, and sampled rows after
a shared prefix, prompts of mixed lengths. Writes `<family>_<case>_<where>.npz` (tokens,
lengths, both log-probs) and `<family>_layout.json`: the output shardings of the compiled
sampling program (the caches it returns after the decode loop) and whether any of the
program's buffers has a cache's global shape (a batch gathered onto one device).
"""

import json
import pathlib
import re
import sys

import jax
import numpy as np
from flax import nnx

from hat_jax.sharding import MeshConfig, make_mesh, state_shardings
from models import Qwen, QwenConfig, Sampler, Sampling
from tests.models.qwen_fixtures import tiny_qwen3_moe

FAMILIES = {
    "qwen3_5": QwenConfig.preset("tiny", dtype="float32", moe_dispatch="dense"),
    "qwen3_moe": tiny_qwen3_moe(vocab_size=2048, moe_dispatch="dense"),
}
LENGTHS = (150, 41, 7, 90, 3)
NEW_TOKENS = 20
PREFIX = 32
MESH = dict(data=2, fsdp=4)


def _prompts(vocab: int, shared: bool) -> list[list[int]]:
    rng = np.random.default_rng(1)
    head = rng.integers(1, vocab, PREFIX).tolist() if shared else []
    return [head + rng.integers(1, vocab, n).tolist() for n in LENGTHS]


# Two programs per family and placement (each compiles for seconds), between them covering
# both strategies and both prefills: greedy rows without a shared prefix, and sampled rows
# (top-k and top-p both on, the widest sampling program) after one.
CASES = {
    "greedy": dict(sampling=Sampling(temperature=0.0), shared=False),
    "sampled_prefix": dict(sampling=Sampling(temperature=1.0, top_k=50, top_p=0.9), shared=True),
}


def _sample(sampler: Sampler, vocab: int, case: dict):
    prompts = _prompts(vocab, case["shared"])
    return sampler(prompts, max_new_tokens=NEW_TOKENS, sampling=case["sampling"], seed=7,
                   shared_prefix=PREFIX if case["shared"] else 0)  # fmt: skip


def _layout(sampler: Sampler, config: QwenConfig) -> dict:
    """Where the compiled program keeps the caches: their output shardings, and whether
    any buffer of the per-device program has a cache's global (unsplit) shape."""
    lowered = sampler.lower(len(LENGTHS), max(LENGTHS), NEW_TOKENS)
    compiled = lowered.compile()
    state = compiled.output_shardings
    caches = {}
    for i, layer in enumerate(state.cache.layers):
        for name, sharding in vars(layer).items():
            caches[f"{i}.{name}"] = [list(a) if isinstance(a, tuple) else a for a in sharding.spec]
    text = compiled.as_text()
    dtype = "f32" if config.dtype == "float32" else "bf16"
    cache = lowered.out_info.cache
    cache_shapes = [tuple(leaf.shape) for leaf in jax.tree.leaves(cache) if leaf.ndim > 2]

    def found(shape):
        return bool(re.search(rf"(f32|{dtype})\[{','.join(str(d) for d in shape)}\]", text))

    rows = cache.end.shape[0]
    gathered = [list(s) for s in cache_shapes if found(s)]
    split = [list(s) for s in cache_shapes if found((s[0], rows // 8, *s[2:]))]
    memory = compiled.memory_analysis()
    return dict(
        caches=caches,
        end=list(state.cache.end.spec),
        tokens=list(state.out.tokens.spec),
        gathered=gathered,
        split=split,
        cache_leaves=len(cache_shapes),
        output_bytes=int(memory.output_size_in_bytes),
        rows=int(rows),
    )


def main(out_dir: str) -> None:
    out = pathlib.Path(out_dir)
    mesh = make_mesh(MeshConfig(**MESH), devices=jax.devices()[:8])
    for family, config in FAMILIES.items():
        with nnx.use_eager_sharding(False):
            model = Qwen(config, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        placed = jax.device_put(state, state_shardings(state, mesh))
        sharded = nnx.merge(graphdef, placed)
        samplers = {"one": Sampler(model), "mesh": Sampler(sharded)}
        assert samplers["one"].mesh is None and samplers["mesh"].mesh is not None
        for name, case in CASES.items():
            for where, sampler in samplers.items():
                got = _sample(sampler, config.vocab_size, case)
                np.savez(out / f"{family}_{name}_{where}.npz", tokens=got.tokens,
                         lengths=got.lengths, logprobs=got.logprobs,
                         policy_logprobs=got.policy_logprobs)  # fmt: skip
        layout = _layout(samplers["mesh"], config)
        (out / f"{family}_layout.json").write_text(json.dumps(layout))
        print(json.dumps({"done": family}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
