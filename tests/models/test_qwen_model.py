"""The Qwen module: outputs, logical axis names, construction with and without a mesh, remat
policies, the bfloat16 path, and errors on bad inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hat_jax.sharding import MeshConfig, init_sharded, make_mesh, state_shardings
from models import AXIS_NAMES, Qwen, QwenConfig
from tests.models.qwen_fixtures import forward

# One block of the Qwen3.5 pattern, small enough to compile quickly.
TINY = QwenConfig.preset("tiny")


def _ids(batch=2, length=48, seed=0):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, (batch, length), np.int32)


def test_outputs():
    model = Qwen(TINY, rngs=nnx.Rngs(0))
    out = forward(model, _ids())
    assert out.logits.shape == (2, 48, TINY.vocab_size)
    assert out.hidden.shape == (2, 48, TINY.hidden_size)
    assert out.cache is None
    # The hidden states are after the final norm: the LM head applies to them directly.
    np.testing.assert_allclose(out.logits, out.hidden @ model.lm_head[...], rtol=1e-5, atol=1e-5)
    # Random routing is not balanced: the loss is positive and near its balanced value top-k.
    assert 0.9 * TINY.num_experts_per_tok < float(out.aux_loss) < 2 * TINY.num_experts_per_tok


def test_every_parameter_carries_logical_axis_names():
    model = Qwen(TINY, rngs=nnx.Rngs(0))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = var.get_metadata()["out_sharding"]
        assert len(names) == var.get_value().ndim, path
        assert set(names) - {None} <= set(AXIS_NAMES), (path, names)
        assert (names[0] == "layers") == (path[0] == "blocks"), (path, names)


def test_same_seed_same_weights_and_tied_embeddings():
    a = nnx.state(Qwen(TINY, rngs=nnx.Rngs(3)), nnx.Param)
    b = nnx.state(Qwen(TINY, rngs=nnx.Rngs(3)), nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    tied = Qwen(TINY.replace(tie_word_embeddings=True), rngs=nnx.Rngs(0))
    assert not hasattr(tied, "lm_head")
    out = forward(tied, _ids())
    np.testing.assert_allclose(out.logits, out.hidden @ tied.embed[...].T, rtol=1e-5, atol=1e-5)


def test_sharded_construction_on_a_mesh():
    """Built directly in the layout the rules give its logical names; the values equal an
    unsharded build. (Sharded forward and backward passes are checked against one device by
    tests/train/test_qwen_sharded.py, in a subprocess with XLA's classic CPU runtime.)"""
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, expert=2, tensor=2))
    sharded = init_sharded(lambda: Qwen(TINY, rngs=nnx.Rngs(0)), mesh)
    state = nnx.state(sharded, nnx.Param)
    expected = state_shardings(state, mesh)
    for (path, var), (_, want) in zip(nnx.to_flat_state(state), nnx.to_flat_state(expected)):
        value = var.get_value()
        assert value.sharding.is_equivalent_to(want.get_value(), value.ndim), path
    experts = sharded.blocks.layers[0].moe.gate_up_proj.get_value()
    # [layers, expert, embed, 2, mlp]: whole experts per device, over expert x fsdp
    assert experts.sharding.spec[1] == ("expert", "fsdp")
    single = nnx.state(Qwen(TINY, rngs=nnx.Rngs(0)), nnx.Param)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(single)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@functools.partial(jax.jit, static_argnums=0)
def _loss_and_grads(graphdef, state, ids):
    def loss(state):
        out = nnx.merge(graphdef, state)(ids)
        logp = jax.nn.log_softmax(out.logits[:, :-1])
        nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()
        return nll + 0.01 * out.aux_loss

    return jax.value_and_grad(loss)(state)


@pytest.mark.slow
def test_remat_policies_change_memory_not_math():
    # Remat wraps the scanned block whatever it holds: the cheapest block to compile will do.
    config = QwenConfig.preset("qwen3_30b_a3b").replace(
        vocab_size=256, hidden_size=32, num_layers=2, layer_types=("full_attention",) * 2,
        num_heads=2, num_kv_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, dtype="float32",
    )  # fmt: skip
    results = {}
    for policy in ("none", "full", "save_dots"):
        model = Qwen(config.replace(remat=policy, moe_dispatch="sorted"), rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        results[policy] = _loss_and_grads(graphdef, state, jnp.asarray(_ids(length=16) % 256))
    loss, grads = results["none"]
    assert np.isfinite(float(loss))
    for policy in ("full", "save_dots"):
        other_loss, other_grads = results[policy]
        np.testing.assert_allclose(other_loss, loss, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(other_grads), jax.tree.leaves(grads)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_capacity_dispatch_in_the_model_matches_dense():
    """The model's "capacity" dispatch (config factor and block size, the model's expert
    count) gives the dense dispatch's loss and gradients; at factor 0.5 the grid holds
    about half the rows and the overflow loop runs the rest."""
    factor = 0.5
    ids = jnp.asarray(_ids(length=32))
    results = {}
    for dispatch in ("dense", "capacity"):
        config = TINY.replace(moe_dispatch=dispatch, moe_capacity_factor=factor, moe_block_size=8)
        graphdef, state = nnx.split(Qwen(config, rngs=nnx.Rngs(0)))
        results[dispatch] = jax.jit(_loss_and_grads, static_argnums=0)(graphdef, state, ids)
    (loss, grads), (want_loss, want_grads) = results["capacity"], results["dense"]
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_bfloat16_compute_path():
    ids = _ids()
    ref = forward(Qwen(TINY, rngs=nnx.Rngs(0)), ids).logits
    model = Qwen(TINY.replace(dtype="bfloat16", param_dtype="bfloat16"), rngs=nnx.Rngs(0))
    out = forward(model, ids)
    assert out.logits.dtype == jnp.bfloat16
    assert model.embed.get_value().dtype == jnp.bfloat16
    logits = np.asarray(out.logits, np.float32)
    assert np.isfinite(logits).all()
    # bfloat16 keeps about 3 significant digits: close to float32, not equal.
    assert np.abs(logits - np.asarray(ref)).max() < 0.05 * np.abs(np.asarray(ref)).max()


def test_bad_inputs_fail_clearly():
    model = Qwen(TINY, rngs=nnx.Rngs(0))
    ids = jnp.asarray(_ids(length=8))
    with pytest.raises(TypeError, match="models.Cache"):
        model(ids, cache={})
    with pytest.raises(ValueError, match="segment_ids shape"):
        model(ids, segment_ids=jnp.ones((2, 7), jnp.int32))
    with pytest.raises(ValueError, match="positions shape"):
        model(ids, positions=jnp.ones((1, 8), jnp.int32))
