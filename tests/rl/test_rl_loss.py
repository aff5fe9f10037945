"""The HSA-RL loss computed a chunk of positions at a time (`logits_chunk`) equals the loss on
the full logits: values, metrics and gradients, with and without the reference KL."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from hat_jax.train import chunked_token_logprobs, token_logprobs
from rl._rl_loss import rl_loss
from rl._rl_stage import recompute_logprobs


def test_chunked_token_logprobs_equal_the_full_logits():
    k = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(k[0], (2, 13, 8))
    head = jax.random.normal(k[1], (8, 11))
    targets = jax.random.randint(k[2], (2, 13), 0, 11)
    full = lambda h, w: token_logprobs(h @ w, targets)  # noqa: E731
    chunked = lambda h, w: chunked_token_logprobs(h, w, targets, chunk=5)  # noqa: E731
    np.testing.assert_allclose(chunked(hidden, head), full(hidden, head), rtol=1e-6, atol=1e-6)
    cot = jax.random.normal(jax.random.key(1), (2, 13))
    grad = lambda f: jax.grad(lambda h, w: jnp.sum(f(h, w) * cot), (0, 1))(hidden, head)  # noqa: E731
    for a, b in zip(grad(chunked), grad(full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _tiny(seed):
    config = models.QwenConfig.preset(
        "tiny", vocab_size=97, num_layers=2, layer_types=("linear_attention", "full_attention")
    )
    return models.Qwen(config, rngs=nnx.Rngs(seed))


def _batch(rows=3, t=21, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, t), np.int32)
    for r in range(rows):
        mask[r, rng.integers(5, 12) : t - r] = 1  # context first, then sampled tokens
    return {
        "input_ids": rng.integers(1, 97, (rows, t)).astype(np.int32),
        "loss_mask": mask,
        "segment_ids": np.ones((rows, t), np.int32),
        "positions": np.tile(np.arange(t, dtype=np.int32), (rows, 1)),
        "old_logprobs": (rng.normal(size=(rows, t)) * 0.1 - 4.6).astype(np.float32) * mask,
        "advantages": np.repeat(rng.normal(size=(rows, 1)), t, 1).astype(np.float32) * mask,
        "fresh": np.ones((rows, t), np.int32),
    }


@pytest.mark.slow
def test_the_chunked_rl_loss_equals_the_full_logits_loss():
    policy, reference = _tiny(0), _tiny(1)
    graphdef, params, rest = nnx.split(policy, nnx.Param, ...)
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}

    def loss(params, chunk):
        model = types.SimpleNamespace(policy=nnx.merge(graphdef, params, rest),
                                      reference=reference)  # fmt: skip
        out = rl_loss(model, batch, None, eps_low=0.2, eps_high=0.2, kl_coef=0.1,
                      logits_chunk=chunk)  # fmt: skip
        return out.total / out.weight, out.metrics

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (a, metrics_a), grads_a = value_and_grad(params, 0)
    (b, metrics_b), grads_b = value_and_grad(params, 8)  # 20 positions in chunks of 8
    np.testing.assert_allclose(b, a, rtol=1e-5)
    for name in metrics_a:
        np.testing.assert_allclose(metrics_b[name], metrics_a[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)  # fmt: skip
    flat_a, flat_b = jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)
    assert max(float(jnp.max(jnp.abs(g))) for g in flat_a) > 0
    for x, y in zip(flat_b, flat_a, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_recomputed_logprobs_are_the_same_chunked_or_not():
    policy, rows = _tiny(0), _batch()
    full = recompute_logprobs(policy, rows)
    chunked = recompute_logprobs(policy, rows, logits_chunk=6)
    np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-6)
    assert np.all(full[rows["loss_mask"] == 0] == 0) and np.all(full[rows["loss_mask"] == 1] < 0)
