"""Parameter-only checkpoints: the model's weights plus its config, readable without the trainer.

`save_params` writes one directory::

    <directory>/params/             an Orbax PyTree: the parameter state as a nested dict of arrays
    <directory>/model_config.json   the model config as a JSON object

`restore_params` reads that layout, a training step directory written by
`hat_jax.checkpoint.CheckpointManager` (`<run>/checkpoints/<step>/`, whose `params` item has the
same form), or a run's `checkpoints/` folder (its latest step). It restores into a given
abstract target (shapes, dtypes and shardings: nothing is materialised on one device) or, with
no target, into host numpy arrays. This module knows nothing of optimisers or data iterators.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from hat_jax import files

PARAMS_ITEM = "params"
MODEL_CONFIG_FILE = "model_config.json"
# Inside a CheckpointManager step the model config is a JSON item of that name.
MODEL_CONFIG_ITEM = "model_config"


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or does not match what it is restored into."""


class CheckpointMismatchError(CheckpointError):
    """A readable checkpoint whose parameters do not match the target's names or shapes."""


def _is_primary() -> bool:
    return jax.process_index() == 0


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def write_json_atomic(path: os.PathLike | str, obj: Any) -> None:
    """Writes `obj` as JSON to `path` through a temporary file and `os.replace`."""
    files.write_json(path, obj, sort_keys=True)


def to_pure_tree(state: Any) -> Any:
    """An `nnx.State` (or a pure nested dict) as a nested dict of its leaf values."""
    if isinstance(state, nnx.State):
        return nnx.to_pure_dict(state)
    if isinstance(state, Mapping):
        return {k: to_pure_tree(v) for k, v in state.items()}
    if isinstance(state, nnx.Variable):
        return state.get_value()
    return state


def save_params(
    directory: os.PathLike | str,
    params_state: Any,
    *,
    model_config: Mapping[str, Any],
    overwrite: bool = False,
) -> pathlib.Path:
    """Saves a model's parameters and config as one directory, atomically.

    Call it on every JAX process with the same arguments (arrays may be sharded across
    processes). Everything is written under a hidden sibling folder that is renamed into place
    at the end, so `directory` either holds a complete checkpoint or does not exist.

    Args:
      directory: the checkpoint directory to create.
      params_state: the parameter state (`nnx.State` from `nnx.split(model, nnx.Param, ...)`
        or a nested dict of arrays).
      model_config: a JSON-serialisable description of the model (e.g. `QwenConfig.to_hf_dict()`
        or the dataclass as a dict) written as `model_config.json`.
      overwrite: replace an existing `directory` instead of failing.

    Returns:
      The directory written.
    """
    directory = pathlib.Path(directory).absolute()
    if directory.exists() and not overwrite:
        raise CheckpointError(f"{directory} already exists (pass overwrite=True to replace it)")
    try:
        config_text = json.dumps(dict(model_config))
    except TypeError as err:
        raise CheckpointError(f"model_config is not JSON-serialisable: {err}") from err
    partial = directory.with_name(f".{directory.name}.partial")
    if _is_primary():
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        write_json_atomic(partial / MODEL_CONFIG_FILE, json.loads(config_text))
    _sync("hat_jax.save_params.begin")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(partial / PARAMS_ITEM, to_pure_tree(params_state))
        checkpointer.wait_until_finished()
    _sync("hat_jax.save_params.written")
    if _is_primary():
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(partial, directory)
    _sync("hat_jax.save_params.done")
    return directory


def _step_dirs(directory: pathlib.Path) -> list[pathlib.Path]:
    steps = [p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(steps, key=lambda p: int(p.name))


def resolve_params_dir(directory: os.PathLike | str) -> pathlib.Path:
    """The checkpoint directory that holds a `params` item for `directory`.

    Accepts a `save_params` directory, a training step directory, or a run's `checkpoints/`
    folder (then the latest step that has a `params` item).
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    if (directory / PARAMS_ITEM).is_dir():
        return directory
    steps = [p for p in _step_dirs(directory) if (p / PARAMS_ITEM).is_dir()]
    if steps:
        return steps[-1]
    raise CheckpointError(
        f"{directory} holds no '{PARAMS_ITEM}' item: expected a directory written by "
        "save_params, a training step directory, or a run's checkpoints/ folder"
    )


def read_model_config(directory: os.PathLike | str) -> dict[str, Any]:
    """The model config saved beside the parameters of a checkpoint directory."""
    directory = resolve_params_dir(directory)
    for candidate in (directory / MODEL_CONFIG_FILE, directory / MODEL_CONFIG_ITEM / "metadata"):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except json.JSONDecodeError as err:
                raise CheckpointError(f"{candidate} is not valid JSON: {err}") from err
    raise CheckpointError(f"{directory} has no {MODEL_CONFIG_FILE}")


def _flat(tree: Any) -> dict[str, Any]:
    return {
        "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def describe_mismatch(
    expected: Mapping[str, tuple[int, ...]],
    found: Mapping[str, tuple[int, ...]],
    *,
    found_as: str = "found",
    limit: int = 40,
) -> list[str]:
    """The missing, unexpected and mis-shaped names of `found` against `expected`, one line
    per kind (empty when they match); shared by checkpoint restores and HF loading.

    Args:
      expected: name -> shape that should be there.
      found: name -> shape that is there.
      found_as: what `found` is, in the shape lines (e.g. "checkpoint", "file").
      limit: names listed per kind; the count is always the full one.
    """

    def listed(items: list[str], sep: str) -> str:
        return sep.join(items[:limit]) + (f"{sep}..." if len(items) > limit else "")

    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    shapes = [
        f"{name}: {found_as} {tuple(found[name])} vs expected {tuple(shape)}"
        for name, shape in expected.items()
        if name in found and tuple(found[name]) != tuple(shape)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing: {listed(missing, ', ')}")
    if extra:
        problems.append(f"{len(extra)} unexpected: {listed(extra, ', ')}")
    if shapes:
        problems.append(f"{len(shapes)} with a shape mismatch: {listed(shapes, '; ')}")
    return problems


def _check_target(saved: Mapping[str, Any], target: Any, where: pathlib.Path) -> None:
    """Raises a `CheckpointMismatchError` naming every missing, extra or mis-shaped parameter."""
    problems = describe_mismatch(
        {name: leaf.shape for name, leaf in _flat(target).items()},
        {name: leaf.shape for name, leaf in _flat(saved).items()},
        found_as="checkpoint",
    )
    if problems:
        raise CheckpointMismatchError(
            f"parameters in {where} do not match the target: " + " | ".join(problems)
        )


def _abstract_leaf(leaf: Any) -> jax.ShapeDtypeStruct:
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def restore_params(
    directory: os.PathLike | str, *, target: Any = None
) -> tuple[Any, dict[str, Any]]:
    """Restores parameters and the model config saved beside them.

    Args:
      directory: a `save_params` directory, a training step directory, or a run's
        `checkpoints/` folder (its latest step).
      target: what to restore into: an `nnx.State` or nested dict whose leaves are arrays or
        `jax.ShapeDtypeStruct`s (with shardings: each device reads only its shards; dtypes may
        differ from the saved ones and are cast). `None` restores host numpy arrays.

    Returns:
      `(params_state, model_config)`: an `nnx.State` if `target` is one, else a nested dict
      (integer keys restored for list-like modules), and the saved model config dict.
    """
    directory = resolve_params_dir(directory)
    model_config = read_model_config(directory)
    params_dir = (directory / PARAMS_ITEM).absolute()
    with ocp.PyTreeCheckpointer() as checkpointer:
        try:
            saved = checkpointer.metadata(params_dir).item_metadata.tree
        except Exception as err:  # Orbax raises several types for unreadable metadata.
            raise CheckpointError(
                f"cannot read the parameter metadata in {params_dir}: {err}"
            ) from err
        if target is None:
            args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
            restored = checkpointer.restore(
                params_dir, args=ocp.args.PyTreeRestore(restore_args=args)
            )
            return nnx.restore_int_paths(restored), model_config
        pure_target = jax.tree.map(_abstract_leaf, to_pure_tree(target))
        _check_target(saved, pure_target, params_dir)
        args = jax.tree.map(
            lambda leaf: ocp.ArrayRestoreArgs(
                sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype
            ),
            pure_target,
        )
        restored = checkpointer.restore(
            params_dir, args=ocp.args.PyTreeRestore(item=pure_target, restore_args=args)
        )
    if isinstance(target, nnx.State):
        state = jax.tree.map(lambda x: x, target)  # fresh Variables: the target is not mutated
        nnx.replace_by_pure_dict(state, restored)
        return state, model_config
    return restored, model_config
