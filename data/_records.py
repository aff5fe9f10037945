"""Corpus records and the files that hold them (ArrayRecord shards plus JSONL for reading).

A corpus record is one JSON object per teacher trajectory:

    {"schema": "hat_jax.corpus/1", "id": str,
     "scenario": {...}, "teacher": {...}, "rewards": {...},
     "state": {"kind": "original" | "augmented", "base_version", "seed", "dims",
               "strength", "harness_version", "constraints": {name: value}},
     "retry_history": "none" | "final_only" | "full",
     "tools": [OpenAI schemas], "messages": [the training conversation],
     "trajectory": {the full Trajectory record}}

`messages` is the conversation after the retry-history policy, ready to render; `trajectory`
keeps everything else (the request and renames online HSA re-renders from, every model call,
hook event and timing for inspection). Any `{"messages", "tools"}` record also trains.

`CorpusWriter` writes `<split>-NNNNN-of-MMMMM.array_record` shards (records round-robin) and
`<split>.jsonl`, each to a temporary name first and renamed when closed, so a reader never
sees a half-written file.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from data._convert import has_retries, malformed_turns, trajectory_conversation
from hat_jax import files
from hat_jax import harness as hx

SCHEMA = "hat_jax.corpus/1"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Temporary files are private (0600); the finished files get the usual permissions.
_FILE_MODE = 0o666 & ~_umask()
RETRY_HISTORY = ("none", "final_only", "full")


def state_info(
    state: hx.HarnessState,
    *,
    kind: str = "original",
    seed: int | None = None,
    dims: Iterable[str] = (),
    strength: float = 0.0,
    base_version: str | None = None,
) -> dict[str, Any]:
    """What a record says about the Harness state it was generated in.

    `base_version` is the released Harness the state was derived from (default: the state's
    own version, right for an original state); online HSA refuses to re-render a record under
    augmentations of a different base.
    """
    return {
        "kind": kind,
        "base_version": base_version or state.harness.version,
        "seed": seed,
        "dims": sorted(str(d) for d in dims),
        "strength": strength,
        "harness_version": state.harness.version,
        "constraints": {c.name: c.value for c in state.harness.prompt.constraints},
    }


def corpus_record(
    trajectory: hx.Trajectory,
    *,
    record_id: str,
    tools: list[dict[str, Any]],
    state: Mapping[str, Any],
    keep_retries: bool = False,
    scenario: Mapping[str, Any] | None = None,
    teacher: Mapping[str, Any] | None = None,
    rewards: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A corpus record of one trajectory under the retry-history policy.

    Args:
      trajectory: the teacher's run.
      record_id: unique within the corpus.
      tools: the tool schemas of the state it ran in.
      state: `state_info(...)` of that state.
      keep_retries: keep the complete retry history (when there is one).
      scenario, teacher, rewards: metadata kept for statistics and inspection.

    Raises:
      ConversionError: the run has no valid final behaviour.
    """
    retried = has_retries(trajectory.messages, malformed_turns(trajectory))
    conv = trajectory_conversation(
        trajectory, tools, keep_retries=keep_retries and retried, conversation_id=record_id
    )
    return {
        "schema": SCHEMA,
        "id": record_id,
        "scenario": dict(scenario or {}),
        "teacher": dict(teacher or {}),
        "rewards": dict(rewards or {}),
        "state": dict(state),
        "retry_history": ("full" if keep_retries else "final_only") if retried else "none",
        "tools": tools,
        "messages": conv.messages,
        "trajectory": trajectory.to_dict(),
    }


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class CorpusWriter:
    """Writes one split of a corpus: ArrayRecord shards and a JSONL copy, atomically.

    Use as a context manager; files appear under their final names only on a clean exit.

    Args:
      directory: the corpus directory.
      split: file-name prefix (`train`, `dev`, ...).
      num_shards: ArrayRecord shards to spread records over.
      jsonl: also write `<split>.jsonl`.
    """

    def __init__(
        self, directory: os.PathLike | str, split: str, *, num_shards: int = 1, jsonl: bool = True
    ):
        if num_shards < 1:
            raise ValueError(f"num_shards must be positive, got {num_shards}")
        from array_record.python import array_record_module

        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.split, self.count = split, 0
        self._final: list[pathlib.Path] = [
            self.directory / f"{split}-{k:05d}-of-{num_shards:05d}.array_record"
            for k in range(num_shards)
        ]
        self._tmp = [self._temp_name(p) for p in self._final]
        self._writers = [
            array_record_module.ArrayRecordWriter(str(t), "group_size:1") for t in self._tmp
        ]
        self._jsonl = None
        if jsonl:
            self._final.append(self.directory / f"{split}.jsonl")
            self._tmp.append(self._temp_name(self._final[-1]))
            self._jsonl = open(self._tmp[-1], "w", encoding="utf-8")  # noqa: SIM115

    def _temp_name(self, path: pathlib.Path) -> pathlib.Path:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.directory)
        os.fchmod(fd, _FILE_MODE)
        os.close(fd)
        return pathlib.Path(name)

    def write(self, record: Mapping[str, Any]) -> None:
        line = _dumps(record)
        self._writers[self.count % len(self._writers)].write(line.encode("utf-8"))
        if self._jsonl is not None:
            self._jsonl.write(line + "\n")
        self.count += 1

    @property
    def files(self) -> list[pathlib.Path]:
        return list(self._final)

    def close(self, *, commit: bool = True) -> None:
        for w in self._writers:
            w.close()
        if self._jsonl is not None:
            self._jsonl.flush()
            os.fsync(self._jsonl.fileno())
            self._jsonl.close()
        for tmp, final in zip(self._tmp, self._final, strict=True):
            if commit:
                os.replace(tmp, final)
            elif tmp.exists():
                tmp.unlink()

    def __enter__(self) -> CorpusWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(commit=exc_type is None)


def write_json(path: os.PathLike | str, data: Any) -> pathlib.Path:
    """Writes JSON atomically; frozen mappings and tuples are written as objects and lists."""
    return files.write_json(path, data, default=_json_default)
