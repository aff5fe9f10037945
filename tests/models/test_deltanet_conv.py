"""DeltaNet's segment-aware causal depthwise conv: values and gradients against a per-tap
reference, on packed rows (a segment starting mid-row, a one-token segment) and on rows
shorter than the kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models._deltanet import causal_conv


def _reference(x, weight, doc):
    """sum_s weight[K - 1 - s] x[t - s], taps into an earlier segment (or before 0) zeroed."""
    kernel, length = weight.shape[0], x.shape[1]
    out = jnp.zeros_like(x)
    for s in range(kernel):
        for t in range(s, length):
            same = (doc[:, t - s] == doc[:, t])[:, None]
            out = out.at[:, t].add(jnp.where(same, x[:, t - s] * weight[kernel - 1 - s], 0.0))
    return out


@pytest.mark.parametrize("length", [2, 13])
def test_conv_values_and_gradients_match_reference(length):
    rng = np.random.default_rng(length)
    kernel, channels = 4, 6
    x = jnp.asarray(rng.normal(size=(2, length, channels)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(kernel, channels)), jnp.float32)
    seg = np.zeros((2, length), np.int32)
    seg[0, length // 2 + 1 :] = 1  # a segment starting mid-row (none when short)
    seg[1, 1:] = 1  # a one-token segment, then another
    seg[1, 2:] = 2
    doc = jnp.asarray(seg)
    w = jnp.asarray(rng.normal(size=x.shape), jnp.float32)

    def grads(f):
        return jax.value_and_grad(lambda x, wt: jnp.sum(f(x, wt, doc) * w), argnums=(0, 1))(
            x, weight
        )

    (got, got_grads), (want, want_grads) = grads(jax.jit(causal_conv)), grads(_reference)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name, a, b in zip(["x", "weight"], got_grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
