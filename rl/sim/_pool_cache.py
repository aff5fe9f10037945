"""An on-disk cache of generated scenario pools, keyed by everything that determines them.

Generating a bundled room's pool runs the scripted teacher over every template instance: 2 s
for Harness v0's 3,841 scenarios, 10 s for the micro room's 31,443, in every process that
needs one (each RL, evaluation and corpus launch). The pool is a pure function of the room's
files and the generator's code, so it is pickled once and read back (0.5 s for the micro room).

The key is a SHA-256 over the room's data files (world, Harness, phrasings) and the source of
every module of the `hat_jax` and `rl` packages (this one included, so a change to the file
layout is a new key too), so any edit to the data or the code misses the cache and
regenerates; the Python version and the pickle protocol are part of it too.
Files are written atomically (`hat_jax.files.atomic_open`), so processes that generate the
same pool at once each write a whole file and a reader never sees half of one.
An unreadable file is regenerated and replaced, with a warning.

`$HAT_JAX_SCENARIO_CACHE` sets the directory (default `~/.cache/hat_jax/scenarios`); `off`
turns the cache off.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import os
import pathlib
import pickle
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from hat_jax import files

ENV = "HAT_JAX_SCENARIO_CACHE"
DEFAULT_DIR = pathlib.Path("~/.cache/hat_jax/scenarios")
_PROTOCOL = 5
_REPO = pathlib.Path(__file__).resolve().parents[2]
_CODE_PACKAGES = ("hat_jax", "rl")


def cache_dir() -> pathlib.Path | None:
    """The cache directory `$HAT_JAX_SCENARIO_CACHE` names (None when it is `off`)."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    return pathlib.Path(value or DEFAULT_DIR).expanduser()


def _files(root: pathlib.Path, pattern: str) -> list[pathlib.Path]:
    return sorted(p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts)


@functools.cache
def _code_digest() -> str:
    """SHA-256 over the source of every module of the packages the generator can reach."""
    h = hashlib.sha256()
    for package in _CODE_PACKAGES:
        root = _REPO / package
        for path in _files(root, "*.py"):
            h.update(str(path.relative_to(_REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def pool_key(name: str, data_dirs: list[pathlib.Path]) -> str:
    """The key of pool `name` generated from the files under `data_dirs` by this code."""
    h = hashlib.sha256(f"{_PROTOCOL}|{sys.version_info[:2]}|{name}".encode())
    h.update(_code_digest().encode())
    for root in sorted({pathlib.Path(d).resolve() for d in data_dirs}):
        for path in _files(root, "*") if root.is_dir() else [root]:
            h.update(
                str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0"
            )
    return h.hexdigest()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a large acyclic structure is built: unpickling
    the micro room's pool took 3.2 s with it running (repeated passes over every new object)
    and 0.5 s without."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def cached(name: str, data_dirs: list[pathlib.Path], build: Callable[[], Any]) -> Any:
    """`build()`'s value, read from the cache when a file for this key exists, else built and
    written there."""
    directory = cache_dir()
    if directory is None:
        return build()
    path = directory / f"{name}-{pool_key(name, data_dirs)[:24]}.pickle"
    if path.is_file():
        try:
            with gc_paused():
                return pickle.loads(path.read_bytes())
        except Exception as err:  # noqa: BLE001 (any damage: regenerate and replace)
            warnings.warn(f"scenario cache {str(path)!r} is unreadable ({err!r}); regenerating",
                          stacklevel=2)  # fmt: skip
    value = build()
    try:
        with files.atomic_open(path, "wb") as f:
            pickle.dump(value, f, protocol=_PROTOCOL)
    except OSError as err:  # a read-only or full disk costs the next process a regeneration
        warnings.warn(f"scenario cache {str(directory)!r} not written: {err}", stacklevel=2)
    return value
