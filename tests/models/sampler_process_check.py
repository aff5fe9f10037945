"""`models.Sampler` as one process of a multi-process job: `python -m
tests.models.sampler_process_check OUT_DIR`, started by `tests._devices.run_job`.

The tiny Qwen3.5 (DeltaNet + attention) is built sharded over every process's devices (the
default mesh: FSDP over all of them, so the sampler splits its rows over the job's devices),
and samples prompts of mixed lengths: greedy, and sampled with a fixed seed after a shared
prefix. Process `i` writes `OUT_DIR/rows_<i>.npz` (tokens, lengths, both log-probs of every
case), and whether its parameters and its cache rows span other processes' devices.
"""

import json
import pathlib
import sys

import jax
import numpy as np
from flax import nnx

import models
from hat_jax import sharding

LENGTHS = (150, 41, 7, 90, 3, 60, 12, 33)
PREFIX = 32
NEW_TOKENS = 16

if __name__ == "__main__":
    sharding.initialize_distributed()
    out = pathlib.Path(sys.argv[1])
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices())
    config = models.QwenConfig.preset("tiny", dtype="float32", moe_dispatch="dense")
    model = sharding.init_sharded(lambda: models.Qwen(config, rngs=nnx.Rngs(0)), mesh)
    spans = any(not x.is_fully_addressable for x in jax.tree.leaves(nnx.state(model)))
    sampler = models.Sampler(model, max_length=512)
    rng = np.random.default_rng(1)
    head = rng.integers(1, config.vocab_size, PREFIX).tolist()
    plain = [rng.integers(1, config.vocab_size, n).tolist() for n in LENGTHS]
    # Two programs (each compiles for seconds): greedy rows, and seeded sampled rows after a
    # shared prefix.
    cases = {
        "greedy": dict(prompts=plain, sampling=models.GREEDY),
        "sampled_prefix": dict(
            prompts=[head + p for p in plain],
            sampling=models.Sampling(temperature=1.0, top_p=0.9),
            shared_prefix=PREFIX,
        ),
    }
    arrays = {}
    for name, case in cases.items():
        got = sampler(case["prompts"], max_new_tokens=NEW_TOKENS, sampling=case["sampling"],
                      seed=5, shared_prefix=case.get("shared_prefix", 0))  # fmt: skip
        arrays |= {f"{name}_tokens": got.tokens, f"{name}_lengths": got.lengths,
                   f"{name}_logprobs": got.logprobs,
                   f"{name}_policy_logprobs": got.policy_logprobs}  # fmt: skip
    np.savez(out / f"rows_{jax.process_index()}.npz", **arrays)
    facts = {"processes": jax.process_count(), "devices": jax.device_count(),
             "params_span_processes": spans, "rows_split": sampler._rows_multiple}  # fmt: skip
    (out / f"facts_{jax.process_index()}.json").write_text(json.dumps(facts))
