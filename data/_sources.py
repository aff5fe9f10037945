"""Random-access record sources: ArrayRecord shards and JSONL files, one index over all.

Grain's `MapDataset.source` needs `__len__` and `__getitem__`. ArrayRecord shards (what
`launch.make_corpus` writes) are read through Grain's `ArrayRecordDataSource`; JSONL files are
indexed by line offsets once (blank lines skipped) and read by seeking, so neither is loaded
into memory. Each record is returned as bytes; `location(i)` names the file and record for
error messages.
"""

from __future__ import annotations

import bisect
import os
import pathlib
from collections.abc import Sequence

import grain

ARRAY_RECORD_SUFFIX = ".array_record"
JSONL_SUFFIXES = (".jsonl", ".json")


class JsonlSource:
    """Random access to the non-blank lines of a JSONL file (as bytes). Reads are positional
    (`os.pread`), so the threads of several data shards may read one source at once."""

    def __init__(self, path: os.PathLike | str):
        self.path = pathlib.Path(path)
        offsets, lengths = [], []
        with open(self.path, "rb") as f:
            pos = 0
            for line in f:
                if line.strip():
                    offsets.append(pos)
                    lengths.append(len(line))
                pos += len(line)
        self._offsets, self._lengths = offsets, lengths
        self._file = None

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> bytes:
        if self._file is None:
            self._file = open(self.path, "rb")  # noqa: SIM115 - kept open for random reads
        return os.pread(self._file.fileno(), self._lengths[index], self._offsets[index])

    def location(self, index: int) -> str:
        return f"{self.path}:record {index}"

    def __getstate__(self):
        return {**self.__dict__, "_file": None}

    def __repr__(self) -> str:
        return f"JsonlSource({str(self.path)!r}, {len(self)} records)"


class _ArrayRecordSource:
    """Grain's ArrayRecord source with locations."""

    def __init__(self, paths: Sequence[pathlib.Path]):
        self.paths = list(paths)
        self._source = grain.sources.ArrayRecordDataSource([str(p) for p in self.paths])

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> bytes:
        return self._source[index]

    def location(self, index: int) -> str:
        names = ", ".join(p.name for p in self.paths[:3]) + ("..." if len(self.paths) > 3 else "")
        return f"ArrayRecord [{names}]:record {index}"

    def __repr__(self) -> str:
        return f"ArrayRecordSource({len(self.paths)} shards, {len(self)} records)"


class ConcatSource:
    """Several sources read as one, in order."""

    def __init__(self, sources: Sequence):
        if not sources:
            raise ValueError("no record sources given")
        self.sources = list(sources)
        self._starts = [0]
        for s in self.sources:
            self._starts.append(self._starts[-1] + len(s))

    def __len__(self) -> int:
        return self._starts[-1]

    def _find(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range for {len(self)} records")
        k = bisect.bisect_right(self._starts, index) - 1
        return k, index - self._starts[k]

    def __getitem__(self, index: int) -> bytes:
        k, i = self._find(index)
        return self.sources[k][i]

    def location(self, index: int) -> str:
        k, i = self._find(index)
        return self.sources[k].location(i)

    def __repr__(self) -> str:
        return f"ConcatSource({self.sources!r})"


def expand_paths(
    paths: Sequence[os.PathLike | str], split: str | None = None
) -> list[pathlib.Path]:
    """Files behind `paths`: a file stays; a directory gives its `<split>-*.array_record` shards
    (all `*.array_record` without a split), or failing that its `<split>.jsonl`."""
    out: list[pathlib.Path] = []
    for p in map(pathlib.Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            prefix = f"{split}-" if split else ""
            shards = sorted(p.glob(f"{prefix}*{ARRAY_RECORD_SUFFIX}"))
            jsonl = p / f"{split}.jsonl" if split else None
            if shards:
                out += shards
            elif jsonl is not None and jsonl.is_file():
                out.append(jsonl)
            else:
                raise FileNotFoundError(
                    f"{p}: no {prefix}*{ARRAY_RECORD_SUFFIX} shards"
                    + (f" and no {split}.jsonl" if split else "")
                )
        else:
            raise FileNotFoundError(f"record source {p} does not exist")
    return out


def open_source(paths: Sequence[os.PathLike | str], split: str | None = None) -> ConcatSource:
    """One random-access source over ArrayRecord shards and JSONL files (see `expand_paths`)."""
    files = expand_paths(paths, split)
    sources: list = []
    shards: list[pathlib.Path] = []
    for f in files:
        if f.name.endswith(ARRAY_RECORD_SUFFIX):
            shards.append(f)
            continue
        if shards:
            sources.append(_ArrayRecordSource(shards))
            shards = []
        if f.suffix not in JSONL_SUFFIXES:
            raise ValueError(
                f"{f}: unknown record file type (expected {ARRAY_RECORD_SUFFIX} or .jsonl)"
            )
        sources.append(JsonlSource(f))
    if shards:
        sources.append(_ArrayRecordSource(shards))
    return ConcatSource(sources)
