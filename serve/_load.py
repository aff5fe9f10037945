"""HF directory -> `Qwen` and `MTPHead`, and an Orbax head checkpoint -> `MTPHead`.

Parameters are built lazily, one at a time: each stacked parameter is assembled on the host from
its HF tensors and handed to JAX (placed on its shards when asked) before the next is read, so
the host holds at most one stacked parameter beyond the model itself. Names and shapes are
checked first (`serve._hf_read`), so a broken directory fails before any data is read.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from flax import nnx

from hat_jax.checkpoint import CheckpointMismatchError, read_model_config, restore_params
from models import MTPHead, Qwen, QwenConfig, check_mtp_config
from serve import _hf_map
from serve._hf_read import (
    HFCheckpointError,
    Tensors,
    check_mtp_names,
    check_names,
    expected_shapes,
    layer_plan,
)


def dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def path_str(path: tuple) -> str:
    """An `nnx` state path as our parameter name, e.g. "blocks/layers/0/moe/router"."""
    return "/".join(str(p) for p in path)


def abstract_qwen(config: QwenConfig) -> nnx.Module:
    """The model's structure with `jax.ShapeDtypeStruct` leaves: nothing allocated."""
    return nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0)))


def abstract_mtp(config: QwenConfig) -> MTPHead:
    """The draft head's structure with `jax.ShapeDtypeStruct` leaves: nothing allocated."""
    return nnx.eval_shape(lambda: MTPHead(config, rngs=nnx.Rngs(0)))


def _assemble(config: QwenConfig, path: str, shape, np_dtype, tensors, prefix, plan) -> np.ndarray:
    """Our parameter `path` (stacked if a block parameter) built from the HF tensors."""
    if not path.startswith("blocks/layers/"):
        build = _hf_map.global_from_hf(config, prefix)[path]
        return np.asarray(build(tensors.read), np_dtype)
    _, _, position, sub = path.split("/", 3)
    position = int(position)
    period = len(config.block_pattern)
    out = np.empty(shape, np_dtype)
    for block in range(config.num_blocks):
        layer = block * period + position
        kind, experts = plan[layer]
        build = _hf_map.ours_from_hf(config, kind, experts)[sub]
        layer_prefix = f"{prefix}layers.{layer}."
        out[block] = build(lambda suffix, p=layer_prefix: tensors.read(p + suffix))
    return out


def _leaf(value: Any) -> Any:
    return value.get_value() if isinstance(value, nnx.Variable) else value


def _fill(abstract: nnx.Module, build, param_dtype: str, shardings, caller: str) -> nnx.Module:
    """`abstract` with every parameter built on the host (one at a time) and placed."""
    graphdef, state = nnx.split(abstract)
    placement = {}
    if shardings is not None:
        placement = {path_str(p): _leaf(v) for p, v in nnx.to_flat_state(shardings)}
    np_dtype = np.dtype(jnp.dtype(param_dtype))
    for path, var in nnx.to_flat_state(state):
        name = path_str(path)
        value = np.asarray(build(name, var.shape, np_dtype), np_dtype)
        if tuple(value.shape) != tuple(var.shape):
            raise AssertionError(f"{caller}: built {name} {value.shape}, expected {var.shape}")
        if shardings is not None:
            if name not in placement:
                raise ValueError(f"{caller}: shardings has no entry for parameter {name}")
            array = jax.device_put(value, placement[name])
        else:
            array = jnp.asarray(value)
        del value
        var.set_value(array)
    return nnx.merge(graphdef, state)


def load_hf(
    hf_dir: os.PathLike | str,
    *,
    dtype: Any = "float32",
    compute_dtype: Any = None,
    shardings: Any = None,
    **runtime: Any,
) -> tuple[QwenConfig, Qwen]:
    """Loads an HF Qwen3.5-MoE / Qwen3-MoE directory into a `Qwen`.

    Args:
        hf_dir: directory with `config.json` and safetensors (sharded with an index or not).
        dtype: parameter dtype (the config's `param_dtype`).
        compute_dtype: the config's `dtype` (defaults to `dtype`).
        shardings: where to place each parameter: a state of `jax.sharding.Sharding`s with the
            structure of the model's parameter state (e.g. `hat_jax.sharding.state_shardings`
            of `abstract_qwen(config)`); each parameter goes straight to its shards.
        **runtime: other runtime fields of `QwenConfig` (moe_dispatch, remat, ...).

    Returns:
        (config, model).

    Raises:
        HFCheckpointError: tensors missing, unexpected or mis-shaped (all named).
    """
    hf_dir = pathlib.Path(hf_dir)
    param_dtype = dtype_name(dtype)
    config = QwenConfig.from_hf(
        hf_dir,
        param_dtype=param_dtype,
        dtype=dtype_name(compute_dtype or dtype),
        **runtime,
    )
    tensors = Tensors(hf_dir)
    prefix = tensors.prefix
    plan = layer_plan(config, tensors, prefix)
    check_names(tensors, expected_shapes(config, prefix, plan))

    def build(name, shape, np_dtype):
        return _assemble(config, name, shape, np_dtype, tensors, prefix, plan)

    return config, _fill(abstract_qwen(config), build, param_dtype, shardings, "load_hf")


def load_mtp(
    hf_dir: os.PathLike | str,
    *,
    config: QwenConfig | None = None,
    dtype: Any = None,
    compute_dtype: Any = None,
    shardings: Any = None,
    **runtime: Any,
) -> MTPHead:
    """Loads the MTP draft head (the 19 `mtp.*` tensors) of an HF Qwen3.5-MoE directory.

    Grafting: pass the `config` of the (trained) policy the head is to serve; the tensors
    are then checked against that policy's shapes, so a head from a base checkpoint of
    another size is refused with every offending tensor named.

    Args:
        hf_dir: an HF directory (text-only or vision-language layout, fused or per-expert
            expert tensors, sharded with an index or not).
        config: the policy's config (default: the directory's own `config.json`).
        dtype: parameter dtype (default: `config.param_dtype`, float32 from the directory).
        compute_dtype: the config's `dtype` (default: `dtype`, or the given config's).
        shardings: a state of `jax.sharding.Sharding`s with the head's structure (e.g.
            `hat_jax.sharding.state_shardings` of `abstract_mtp(config)`).
        **runtime: other runtime fields of `QwenConfig`.

    Raises:
        HFCheckpointError: no `mtp.*` tensors, or missing / unexpected / mis-shaped ones.
        ValueError: the config's family has no MTP head.
    """
    hf_dir = pathlib.Path(hf_dir)
    if config is None:
        param_dtype = dtype_name(dtype or "float32")
        config = QwenConfig.from_hf(
            hf_dir, param_dtype=param_dtype, dtype=dtype_name(compute_dtype or param_dtype)
        )
    else:
        param_dtype = dtype_name(dtype or config.param_dtype)
        config = config.replace(
            param_dtype=param_dtype, dtype=dtype_name(compute_dtype or dtype or config.dtype)
        )
    config = config.replace(**runtime) if runtime else config
    try:
        check_mtp_config(config)
    except ValueError as err:
        raise HFCheckpointError(f"{hf_dir}: {err}") from err
    tensors = Tensors(hf_dir)
    builders = _hf_map.mtp_from_hf(config, check_mtp_names(tensors, config))

    def build(name, shape, np_dtype):
        return builders[name](tensors.read)

    return _fill(abstract_mtp(config), build, param_dtype, shardings, "load_mtp")


def restore_mtp(directory: os.PathLike | str, config: QwenConfig, *, target: Any = None) -> MTPHead:
    """Restores an `MTPHead` from an Orbax checkpoint of the head.

    Args:
        directory: a `save_params` directory of the head (e.g. `<checkpoint>/mtp`, or the
            adaptation stage's `<run>/head`), or a step directory of the adaptation stage
            (whose `params` item is `{"head": ...}`).
        config: the policy's config (the head has the same).
        target: the head's abstract parameter state with shardings (default: host-local).
    """
    check_mtp_config(config)
    graphdef, abstract = nnx.split(abstract_mtp(config))
    target = abstract if target is None else target
    try:
        state, _ = restore_params(directory, target=target)
    except CheckpointMismatchError as err:
        try:
            nested, _ = restore_params(directory, target={"head": nnx.to_pure_dict(target)})
        except CheckpointMismatchError:
            raise err from None
        state = jax.tree.map(lambda x: x, target)
        nnx.replace_by_pure_dict(state, nested["head"])
    return nnx.merge(graphdef, state)


def config_from_checkpoint(model_config: Mapping[str, Any], **runtime: Any) -> QwenConfig:
    """The `QwenConfig` of an Orbax checkpoint's saved model config (ours or an HF dict)."""
    if "model_type" in model_config:  # an HF config dict
        return QwenConfig.from_hf(dict(model_config), **runtime)
    return QwenConfig.from_dict(dict(model_config)).replace(**runtime)


def is_hf_dir(path: os.PathLike | str) -> bool:
    """Whether `path` is an HF model directory (`config.json` beside safetensors)."""
    path = pathlib.Path(path)
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def load_checkpoint(
    path: os.PathLike | str, *, dtype: Any = "float32", **runtime: Any
) -> tuple[QwenConfig, Qwen]:
    """A policy from an HF directory or an Orbax parameter checkpoint (a `save_params`
    directory, a training step directory or a run's `checkpoints/`, latest step).

    Args:
        path: the checkpoint.
        dtype: parameter and compute dtype.
        **runtime: other runtime fields of `QwenConfig` (moe_dispatch, ...).

    Raises:
        FileNotFoundError: `path` does not exist.
        HFCheckpointError / CheckpointError: the checkpoint is incomplete or malformed (named).
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if is_hf_dir(path):
        return load_hf(path, dtype=dtype, **runtime)
    name = dtype_name(dtype)
    config = config_from_checkpoint(
        read_model_config(path), param_dtype=name, dtype=name, **runtime
    )
    graphdef, abstract_state = nnx.split(abstract_qwen(config))
    state, _ = restore_params(path, target=abstract_state)
    return config, nnx.merge(graphdef, state)
