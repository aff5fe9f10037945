"""Every config under configs/ parses, converts into the library's dataclasses and builds.

A config module exposes `get_config(arg)` and `ARGS` (its variants); `config.stage` names the
launch module whose `build(config)` converts it (`launch.<stage>.build`). Building checks
field names and values; the model is built abstractly (`jax.eval_shape`) and its train state
laid out on a simulated 8-device mesh, so every parameter has a sharding rule.
"""

import importlib
import json
import pathlib
import shutil

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

import models
from hat_jax import sharding, train

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")
CASES = [
    (name, arg)
    for name in CONFIGS
    for arg in getattr(importlib.import_module(f"configs.{name}"), "ARGS", (None,))
]


@pytest.fixture(scope="module")
def fake_hf_dir(tmp_path_factory):
    """A stand-in for a local Hugging Face checkpoint: config.json and tokenizer, no weights."""
    out = tmp_path_factory.mktemp("hf")
    for f in (ROOT / "data" / "tokenizer").iterdir():
        shutil.copy(f, out / f.name)
    config = models.QwenConfig.preset("qwen3_6_35b_a3b").to_hf_dict()
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_every_config_module_is_covered():
    assert {"sft_demo", "sft_qwen3_6_35b_a3b"} <= set(CONFIGS)


@pytest.mark.parametrize(("name", "arg"), CASES)
def test_config_parses_and_builds(name, arg, fake_hf_dir, tmp_path):
    config = importlib.import_module(f"configs.{name}").get_config(arg)
    assert isinstance(config, ml_collections.ConfigDict)
    stage = importlib.import_module(f"launch.{config.stage}")
    config = config.copy_and_resolve_references()
    if config.get("init", {}).get("kind") == "hf" and not config.init.path:
        config.init.path = str(fake_hf_dir)
    built = stage.build(config)
    if config.stage != "sft":
        return
    assert isinstance(built.sft, train.SFTConfig) and built.run_dir.name
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=4))
    model_fn = lambda: models.Qwen(built.model, rngs=nnx.Rngs(0))  # noqa: E731
    _, params, rest = train.abstract_split(model_fn, mesh)
    optimizer = train.make_optimizer(built.sft.optimizer, params)
    state = train.abstract_train_state(params, rest, optimizer, mesh)
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    assert count > 1000
    if built.model.num_experts >= 256:  # the production model: 35B parameters, sharded 4 ways
        assert count > 3.0e10
        biggest = max(jax.tree.leaves(state.params), key=lambda x: x.size)
        assert biggest.sharding.shard_shape(biggest.shape) != biggest.shape


def test_a_bad_override_fails_with_the_field_name():
    config = importlib.import_module("configs.sft_demo").get_config()
    with pytest.raises(ValueError, match="unknown variant"):
        importlib.import_module("configs.sft_demo").get_config("nope")
    config.trainer.micro_batches = 3
    with pytest.raises(ValueError, match="batch_size 2 is not divisible by micro_batches 3"):
        importlib.import_module("launch.sft").build(config)
