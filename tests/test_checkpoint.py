"""Parameter checkpoints (`save_params` / `restore_params`): the contract `serve.convert` uses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hat_jax.checkpoint import (
    CheckpointError,
    describe_mismatch,
    read_model_config,
    restore_params,
    save_params,
)


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


def _train_state(seed=0):
    import optax

    from hat_jax import sharding
    from hat_jax.train import abstract_train_state, init_train_state
    from tests.train.toy_model import LinearLM

    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=8))
    model = sharding.init_sharded(lambda: LinearLM(32, rngs=nnx.Rngs(seed)), mesh)
    optimizer = optax.adam(1e-3)
    _, state = init_train_state(model, optimizer, mesh, seed=seed)
    return state, abstract_train_state(state.params, state.model_state, optimizer, mesh)


def test_manager_keeps_n_and_restores_everything_saved(tmp_path):
    from hat_jax.checkpoint import CheckpointManager

    state, abstract = _train_state()
    manager = CheckpointManager(tmp_path / "checkpoints", keep=2)
    assert manager.restore(abstract) is None, "nothing to restore yet"
    for step in (1, 2, 3):
        manager.save(step, state.replace(step=state.step + step), data_state=b"\x00grain\xff",
                     config={"run": step}, model_config={"vocab": 32})  # fmt: skip
    manager.wait()
    assert manager.steps() == [2, 3]
    restored = manager.restore(abstract)
    assert restored.step == 3 and int(restored.state.step) == 3 and not restored.skipped
    assert restored.data_state == b"\x00grain\xff" and restored.config == {"run": 3}
    kernel = restored.state.params["lm_head"]["kernel"].get_value()
    assert kernel.sharding == abstract.params["lm_head"]["kernel"].get_value().sharding
    for a, b in zip(jax.tree.leaves(restored.state.opt_state), jax.tree.leaves(state.opt_state)):
        np.testing.assert_array_equal(a, b)
    # restore_params reads the params item of a step directory or of the newest step
    params, model_config = restore_params(tmp_path / "checkpoints")
    assert model_config == {"vocab": 32}
    np.testing.assert_array_equal(params["lm_head"]["kernel"], np.asarray(kernel))
    older, _ = restore_params(tmp_path / "checkpoints" / "2")
    np.testing.assert_array_equal(older["lm_head"]["kernel"], np.asarray(kernel))
    manager.close()


def test_an_explicit_unreadable_step_is_an_error_not_a_fallback(tmp_path):
    from hat_jax.checkpoint import CheckpointManager, CheckpointMismatchError

    state, abstract = _train_state()
    manager = CheckpointManager(tmp_path, keep=3, async_save=False)
    manager.save(1, state, config={}, model_config={})
    manager.save(2, state, config={}, model_config={})
    for path in (tmp_path / "2" / "params").rglob("*"):
        if path.is_file() and path.name != "commit_success.txt":
            path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="checkpoint step 2"):
        manager.restore(abstract, step=2)
    assert manager.steps() == [1, 2], "an explicit step is never set aside"
    wrong = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            (x.shape[0] + 8, *x.shape[1:]), x.dtype, sharding=x.sharding
        ),
        abstract.params,
    )
    with pytest.raises(CheckpointMismatchError, match="shape mismatch"):
        manager.restore(abstract.replace(params=wrong), step=1)
    manager.close()


def test_describe_mismatch_names_every_problem_once_per_kind():
    expected = {"a": (2, 3), "b": (4,), "c": (1,)}
    found = {"a": (2, 4), "b": (4,), "z": (5,)}
    assert describe_mismatch(expected, found, found_as="file") == [
        "1 missing: c",
        "1 unexpected: z",
        "1 with a shape mismatch: a: file (2, 4) vs expected (2, 3)",
    ]
    assert describe_mismatch(expected, expected) == []
    many = describe_mismatch({f"p{i}": (1,) for i in range(5)}, {}, limit=2)
    assert many == ["5 missing: p0, p1, ..."]
