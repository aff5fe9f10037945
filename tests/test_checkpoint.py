"""Parameter checkpoints (`save_params` / `restore_params`): the contract `serve.convert` uses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hat_jax.checkpoint import CheckpointError, read_model_config, restore_params, save_params


class _Block(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.Param(jnp.arange(4.0))


class _Net(nnx.Module):
    def __init__(self, seed=0):
        rngs = nnx.Rngs(seed)
        self.layers = nnx.List([_Block(rngs) for _ in range(2)])
        self.head = nnx.Param(jax.random.normal(rngs.params(), (8, 16)))


def _params(seed=0):
    return nnx.split(_Net(seed), nnx.Param)[1]


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def test_round_trip_to_host_numpy(tmp_path):
    params = _params()
    out = save_params(tmp_path / "ckpt", params, model_config={"hidden": 4, "name": "t"})
    assert (out / "params").is_dir() and (out / "model_config.json").is_file()
    restored, config = restore_params(tmp_path / "ckpt")
    assert config == {"hidden": 4, "name": "t"}
    assert set(restored["layers"]) == {0, 1}, "integer keys of list modules come back as ints"
    assert isinstance(restored["head"], np.ndarray)
    for a, b in zip(_leaves(params), _leaves(restored), strict=True):
        np.testing.assert_array_equal(a, b)


def test_restore_into_sharded_abstract_state_with_cast(tmp_path):
    params = _params()
    save_params(tmp_path / "ckpt", params, model_config={})
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

    def abstract(x):
        spec = jax.P(*([None] * (x.ndim - 1)), "x") if x.shape[-1] % 8 == 0 else jax.P()
        return jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=jax.NamedSharding(mesh, spec))

    target = jax.tree.map(abstract, params)
    restored, _ = restore_params(tmp_path / "ckpt", target=target)
    assert isinstance(restored, nnx.State)
    head = restored["head"].get_value()
    assert head.dtype == jnp.bfloat16 and head.sharding.spec == jax.P(None, "x")
    assert len(head.addressable_shards) == 8 and head.addressable_shards[0].data.shape == (8, 2)
    np.testing.assert_allclose(
        np.asarray(head, np.float32), np.asarray(params["head"].get_value()), rtol=1e-2
    )
    assert isinstance(target["head"].get_value(), jax.ShapeDtypeStruct), "target left untouched"


def test_mismatched_target_names_the_parameters(tmp_path):
    save_params(tmp_path / "ckpt", _params(), model_config={})
    target = nnx.to_pure_dict(_params())
    target["head"] = jnp.zeros((8, 17))
    del target["layers"][1]["norm"]
    target["extra"] = jnp.zeros(3)
    with pytest.raises(CheckpointError) as err:
        restore_params(tmp_path / "ckpt", target=target)
    message = str(err.value)
    assert "layers/1/norm" in message and "extra" in message and "head" in message


def test_refuses_to_overwrite_and_writes_nothing_partial(tmp_path):
    save_params(tmp_path / "ckpt", _params(0), model_config={"v": 0})
    with pytest.raises(CheckpointError, match="already exists"):
        save_params(tmp_path / "ckpt", _params(1), model_config={"v": 1})
    save_params(tmp_path / "ckpt", _params(1), model_config={"v": 1}, overwrite=True)
    assert read_model_config(tmp_path / "ckpt") == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "no partial folder left"


def test_bad_inputs_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        restore_params(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no 'params' item"):
        restore_params(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="not JSON-serialisable"):
        save_params(tmp_path / "c", _params(), model_config={"x": object()})
    save_params(tmp_path / "c2", _params(), model_config={"x": 1})
    (tmp_path / "c2" / "model_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_model_config(tmp_path / "c2")
