"""Atomic file writes and JSONL reading, shared by everything that leaves results on disk.

Trajectories, manifests, reports, corpus statistics, caches, plots and Hugging Face exports
are written to a temporary file in the target's directory, flushed and fsynced, then moved over
the target with `os.replace`: a reader, a crash or a preemption never sees a partial file.
Checkpoints (Orbax) and ArrayRecord shards have their own commit protocols and do not go through
here.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")

# mkstemp creates 0600 files; results are meant to be read by others on a shared cluster.
FILE_MODE = 0o644


def _temporary(path: pathlib.Path) -> tuple[int, str]:
    """A new hidden temporary file beside `path` (its directory created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


@contextlib.contextmanager
def atomic_open(
    path: os.PathLike | str, mode: str = "w", *, errors: str | None = None
) -> Iterator[IO]:
    """Opens a temporary file that replaces `path` when the block exits without an exception.

    Args:
      path: the file to (re)place; its directory is created if missing.
      mode: "w" (text, UTF-8, "\\n" line ends) or "wb".
      errors: the text encoding's error handler (e.g. "backslashreplace").
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = pathlib.Path(path)
    fd, tmp = _temporary(path)
    try:
        os.fchmod(fd, FILE_MODE)
        text = dict(encoding="utf-8", errors=errors, newline="\n") if mode == "w" else {}
        with os.fdopen(fd, mode, **text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: os.PathLike | str) -> Iterator[pathlib.Path]:
    """A temporary path beside `path`, for writers that take a file name (e.g.
    `safetensors.numpy.save_file`): when the block exits without an exception the file written
    there is fsynced and moved over `path`; otherwise it is removed and `path` is untouched.
    """
    path = pathlib.Path(path)
    fd, tmp = _temporary(path)
    os.close(fd)
    try:
        yield pathlib.Path(tmp)
        os.chmod(tmp, FILE_MODE)  # after the writer, which may have recreated the file
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def copy_file(src: os.PathLike | str, dst: os.PathLike | str) -> pathlib.Path:
    """Copies the bytes of `src` to `dst` atomically and returns `dst` as a path."""
    with open(src, "rb") as f, atomic_open(dst, "wb") as out:
        shutil.copyfileobj(f, out)
    return pathlib.Path(dst)


def write_text(path: os.PathLike | str, text: str) -> pathlib.Path:
    """Writes `text` to `path` atomically and returns the path."""
    with atomic_open(path) as f:
        f.write(text)
    return pathlib.Path(path)


def write_json(
    path: os.PathLike | str,
    obj: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> pathlib.Path:
    """Writes `obj` as JSON (UTF-8, non-ASCII kept, trailing newline) atomically."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent, sort_keys=sort_keys, default=default)
    return write_text(path, text + "\n")


def write_jsonl(
    path: os.PathLike | str, lines: Iterable[str], *, append: bool = False
) -> pathlib.Path:
    """Writes JSON lines (already serialised, one object per string) atomically.

    With `append=True` the existing lines are kept and the new ones added after them; the file
    is still replaced in one step, so readers never see a partial line. Lone surrogates (from
    raw, untrusted text) are written as escapes rather than failing the write.
    """
    path = pathlib.Path(path)
    with atomic_open(path, errors="backslashreplace") as f:
        if append and path.exists():
            with open(path, encoding="utf-8") as old:
                for line in old:
                    f.write(line if line.endswith("\n") else line + "\n")
        for line in lines:
            f.write(line + "\n")
    return path


def read_jsonl(
    path: os.PathLike | str,
    parse: Callable[[Any], T] = lambda d: d,
    *,
    what: str = "record",
    problems: list[str] | None = None,
) -> list[T]:
    """Reads a JSONL file, applying `parse` to each object; blank lines are skipped.

    With `problems`, a damaged file is read as far as it can be: each line that is not valid
    JSON or that `parse` rejects is skipped and named there (`<file>:<line>: not a <what>
    (<error>); line skipped`, "an" before a lower-case vowel); undecodable bytes are replaced.

    Raises:
      ValueError: (without `problems`) naming the file and line of the first line that is not
        valid JSON or that `parse` rejects (with ValueError, TypeError or KeyError).
    """
    out, article = [], "an" if what[:1] in "aeiou" else "a"
    errors = "strict" if problems is None else "replace"
    with open(path, encoding="utf-8", errors=errors) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(parse(json.loads(line)))
            except (ValueError, TypeError, KeyError) as err:
                if problems is None:
                    raise ValueError(f"{path}:{n}: not {article} {what}: {err}") from err
                why = f"{type(err).__name__}: {str(err)[:80]}"
                problems.append(f"{path}:{n}: not {article} {what} ({why}); line skipped")
    return out
