"""Training checkpoints: Orbax's CheckpointManager with the items a resumable run needs.

Layout of `<run>/checkpoints/<step>/`:

    params/          the model parameters (nested dict, as written by `save_params`)
    train_state/     the rest of the train state: step, optimiser state, RNG, counters
    data/            the data iterator's state, one JSON file per JAX process
                     (`process_<i>-of-<n>.json`)
    config/          the run config (JSON)
    model_config/    the model config (JSON)

The train state's frozen part (`frozen`: a teacher, a reference policy) is never written: it
is an input of the run, read again from its source on resume. With `params_root`, the params
item holds the parameters under that key of the trainable tree (a stage that trains a
`policy` beside frozen models stores it at the root, as a single-model stage does), so every
policy checkpoint restores the same way (`restore_params`).

Saves are asynchronous (arrays are copied to host, then written in the background) and the
newest `keep` steps are kept. `restore` reads into an abstract sharded train state; if the
newest step cannot be read it is reported, moved aside as `unreadable-<step>-<time>`, and the
previous step is used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import time
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from hat_jax.checkpoint._params import (
    MODEL_CONFIG_ITEM,
    PARAMS_ITEM,
    CheckpointError,
    CheckpointMismatchError,
    _check_target,
    to_pure_tree,
)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProcessStates:
    """The data states of every process of a run saved with another process count (in
    process order): a data source that can re-split its position (e.g. by data shards) takes
    what it now reads from them; any other source must refuse them."""

    states: tuple[Any, ...]

    @property
    def count(self) -> int:
        return len(self.states)


def _read_state(path: epath.Path) -> Any:
    record = json.loads(path.read_text())
    state = record["state"]
    return state.encode("latin-1") if record["kind"] == "bytes" else state


class _DataStateHandler(ocp.CheckpointHandler):
    """Writes each process's data-iterator state to `process_<i>-of-<n>.json`."""

    def _file(self, directory: epath.Path, index=None, count=None) -> epath.Path:
        index = jax.process_index() if index is None else index
        count = jax.process_count() if count is None else count
        return directory / f"process_{index}-of-{count}.json"

    def save(self, directory: epath.Path, args: DataStateSave) -> None:
        state = args.state
        if isinstance(state, bytes):
            record = {"kind": "bytes", "state": state.decode("latin-1")}
        else:
            record = {"kind": "str" if isinstance(state, str) else "json", "state": state}
        self._file(directory).write_text(json.dumps(record))

    def restore(self, directory: epath.Path, args: DataStateRestore | None = None) -> Any:
        """This process's state; or, for a checkpoint of another process count, every
        process's state as `ProcessStates`."""
        path = self._file(directory)
        if path.exists():
            return _read_state(path)
        counts = sorted({int(p.name.rsplit("-of-", 1)[1][: -len(".json")])
                         for p in directory.glob("process_*-of-*.json")})  # fmt: skip
        for count in counts:
            paths = [self._file(directory, i, count) for i in range(count)]
            if all(p.exists() for p in paths):
                return ProcessStates(tuple(_read_state(p) for p in paths))
        raise CheckpointError(
            f"no data state for this process at {path}, and no complete set of another "
            f"process count (files for counts {counts})"
        )

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(_DataStateHandler, for_save=True)
@dataclasses.dataclass
class DataStateSave(ocp.args.CheckpointArgs):
    state: Any


@ocp.args.register_with_handler(_DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataStateRestore(ocp.args.CheckpointArgs):
    pass


@dataclasses.dataclass(frozen=True)
class Restored:
    """A restored training checkpoint.

    Attributes:
      step: the step restored.
      state: the train state, laid out like the abstract state given; its `frozen` part is
        the abstract one given (the caller supplies the arrays).
      data_state: this process's data-iterator state (None if none was saved), or
        `ProcessStates` when the checkpoint was written by another number of processes.
      config: the run config saved with it.
      model_config: the model config saved with it.
      skipped: `(step, error)` for newer checkpoints that could not be read.
    """

    step: int
    state: Any
    data_state: Any
    config: dict
    model_config: dict
    skipped: tuple[tuple[int, str], ...] = ()


def _rest(state: Any) -> Any:
    """The part of a train state the `train_state` item holds: not the parameters (their own
    item) and not the frozen state (never written)."""
    rest = state.replace(params={})
    return rest.replace(frozen=None) if hasattr(rest, "frozen") else rest


class CheckpointManager:
    """Saves and restores training checkpoints under `<directory>/<step>/`.

    Args:
      directory: usually `<run>/checkpoints`.
      keep: how many of the newest checkpoints to keep.
      async_save: write in the background (the call returns once arrays are on the host).
      params_root: store `state.params[params_root]` as the params item (the trainable tree
        must hold nothing else), and restore it back under that key.
    """

    def __init__(
        self,
        directory: os.PathLike | str,
        *,
        keep: int = 3,
        async_save: bool = True,
        params_root: str | None = None,
    ):
        if keep < 1:
            raise ValueError(f"CheckpointManager: keep must be >= 1, got {keep}")
        self.params_root = params_root
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, oldest first."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(
        self,
        step: int,
        state: Any,
        *,
        data_state: Any = None,
        config: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
    ) -> None:
        """Starts saving `state` (a `TrainState`) and the rest as checkpoint `step`.

        `data_state` must already be a snapshot (e.g. `source.get_state()` taken right after
        the batch of this step), as it is written after this call returns.
        """
        items = {
            PARAMS_ITEM: ocp.args.StandardSave(self._params_tree(state.params)),
            "train_state": ocp.args.StandardSave(_rest(state)),
            "config": ocp.args.JsonSave(dict(config or {})),
            MODEL_CONFIG_ITEM: ocp.args.JsonSave(dict(model_config or {})),
        }
        if data_state is not None:
            items["data"] = DataStateSave(data_state)
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def wait(self) -> None:
        """Blocks until pending saves are written."""
        self._manager.wait_until_finished()

    def reached_preemption(self, step: int) -> bool:
        """Whether the cluster asked every process to checkpoint at `step` and stop."""
        return self._manager.reached_preemption(step)

    def _params_tree(self, params: Any) -> Any:
        tree = to_pure_tree(params)
        if self.params_root is None:
            return tree
        if set(tree) != {self.params_root}:
            raise ValueError(
                f"CheckpointManager: params_root={self.params_root!r} but the trainable "
                f"parameters are under {sorted(tree)}"
            )
        return tree[self.params_root]

    def _restore_step(self, step: int, abstract_state: Any) -> Restored:
        directory = self.directory / str(step)
        abstract_params = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            self._params_tree(abstract_state.params),
        )
        saved = ocp.PyTreeCheckpointer().metadata(directory / PARAMS_ITEM).item_metadata.tree
        _check_target(saved, abstract_params, directory / PARAMS_ITEM)
        items = {
            PARAMS_ITEM: ocp.args.StandardRestore(abstract_params),
            "train_state": ocp.args.StandardRestore(_rest(abstract_state)),
            "config": ocp.args.JsonRestore(),
            MODEL_CONFIG_ITEM: ocp.args.JsonRestore(),
        }
        if (directory / "data").is_dir():
            items["data"] = DataStateRestore()
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        restored = out[PARAMS_ITEM]
        if self.params_root is not None:
            restored = {self.params_root: restored}
        params = abstract_state.params
        if isinstance(params, nnx.State):
            params = jax.tree.map(lambda x: x, params)
            nnx.replace_by_pure_dict(params, restored)
        else:
            params = restored
        state = out["train_state"].replace(params=params)
        if hasattr(state, "frozen"):
            state = state.replace(frozen=abstract_state.frozen)
        return Restored(
            step=step,
            state=state,
            data_state=out["data"] if "data" in items else None,
            config=out["config"] or {},
            model_config=out[MODEL_CONFIG_ITEM] or {},
        )

    def _set_aside(self, step: int) -> None:
        if jax.process_index() == 0:
            src = self.directory / str(step)
            dst = self.directory / f"unreadable-{step}-{int(time.time())}"
            shutil.move(src, dst)
            _log.warning("moved unreadable checkpoint %s to %s", src, dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"hat_jax.checkpoint.set_aside.{step}")
        self._manager.reload()

    def restore(self, abstract_state: Any, *, step: int | None = None) -> Restored | None:
        """Restores checkpoint `step` (default: the newest readable one) into `abstract_state`.

        Returns None if there is no checkpoint. A checkpoint that cannot be read is logged,
        moved aside and the next older one tried; `Restored.skipped` lists them. Raises
        `CheckpointError` if none can be read, or if an explicit `step` cannot.
        """
        self.wait()
        candidates = [step] if step is not None else sorted(self.steps(), reverse=True)
        skipped: list[tuple[int, str]] = []
        for candidate in candidates:
            try:
                restored = self._restore_step(candidate, abstract_state)
            except CheckpointMismatchError:
                raise  # a config change, not a damaged checkpoint: never set it aside
            except Exception as err:  # Orbax and tensorstore raise many types on bad data.
                message = f"{type(err).__name__}: {err}"
                if step is not None:
                    raise CheckpointError(f"checkpoint step {candidate}: {message}") from err
                _log.warning(
                    "checkpoint step %d is unreadable (%s); trying an older one", candidate, message
                )
                skipped.append((candidate, message))
                self._set_aside(candidate)
                continue
            return dataclasses.replace(restored, skipped=tuple(skipped))
        if skipped:
            raise CheckpointError(
                f"no readable checkpoint in {self.directory}: "
                + "; ".join(f"step {s}: {e}" for s, e in skipped)
            )
        return None

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
