"""Release manifests: what a Harness release contains, and the check before promotion.

A manifest lists every module (Skills, tools, prompt pipeline, hooks) with its declared version
and content hash. Before a Harness is promoted (served, or paired with a checkpoint), it is
reconciled against the manifest of the release: any missing, extra, re-versioned or silently
edited module (same version, different hash) is reported, all at once, and promotion is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

from hat_jax import files
from hat_jax.harness._spec import Harness, ModuleEntry

MANIFEST_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One difference between a Harness and a manifest.

    `problem` is one of: missing (in the manifest, not in the Harness), unexpected (in the
    Harness, not in the manifest), version, hash (content changed under the same version).
    """

    kind: str
    name: str
    problem: str
    expected: str = ""
    actual: str = ""

    def __str__(self) -> str:
        what = {
            "missing": "is in the manifest but not in the Harness",
            "unexpected": "is in the Harness but not in the manifest",
            "version": f"version {self.actual!r} != manifest {self.expected!r}",
            "hash": f"content changed without a version bump (hash {self.actual[:12]} != manifest {self.expected[:12]})",
        }
        return f"{self.kind} {self.name!r} {what[self.problem]}"


class PromotionRefused(RuntimeError):
    """The Harness does not match the release manifest; `.mismatches` lists every difference."""

    def __init__(self, mismatches, manifest_path):
        self.mismatches = tuple(mismatches)
        lines = "\n  ".join(str(m) for m in self.mismatches)
        super().__init__(
            f"promotion refused: {len(self.mismatches)} mismatch(es) against {manifest_path}:\n  {lines}"
        )


def manifest_dict(harness: Harness) -> dict[str, Any]:
    """The manifest of `harness` as JSON data."""
    return {
        "format": MANIFEST_FORMAT,
        "harness": harness.name,
        "release": harness.release,
        "version": harness.version,
        "modules": [dataclasses.asdict(m) for m in harness.manifest()],
    }


def write_manifest(harness: Harness, path: str | os.PathLike) -> pathlib.Path:
    """Writes the manifest of `harness` to `path` atomically."""
    return files.write_json(path, manifest_dict(harness))


def read_manifest(path: str | os.PathLike) -> tuple[ModuleEntry, ...]:
    """Reads the module rows of a manifest file (errors name the file and the row)."""
    data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r} is not {MANIFEST_FORMAT}")
    rows = []
    for i, row in enumerate(data.get("modules", [])):
        try:
            rows.append(
                ModuleEntry(**{k: str(row[k]) for k in ("kind", "name", "version", "hash")})
            )
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"{path}: modules[{i}] needs kind, name, version and hash ({err})"
            ) from err
    return tuple(rows)


def reconcile(harness: Harness, manifest_path: str | os.PathLike) -> list[Mismatch]:
    """Every difference between `harness` and the manifest at `manifest_path` (empty: match)."""
    expected = {(m.kind, m.name): m for m in read_manifest(manifest_path)}
    actual = {(m.kind, m.name): m for m in harness.manifest()}
    out = []
    for key, want in expected.items():
        have = actual.get(key)
        if have is None:
            out.append(Mismatch(*key, "missing", want.version))
        elif have.version != want.version:
            out.append(Mismatch(*key, "version", want.version, have.version))
        elif have.hash != want.hash:
            out.append(Mismatch(*key, "hash", want.hash, have.hash))
    out += [
        Mismatch(*key, "unexpected", "", have.version)
        for key, have in actual.items()
        if key not in expected
    ]
    return out


def promote(harness: Harness, manifest_path: str | os.PathLike) -> Harness:
    """Returns `harness` if it matches the release manifest exactly.

    Raises:
      PromotionRefused: listing every mismatch.
    """
    mismatches = reconcile(harness, manifest_path)
    if mismatches:
        raise PromotionRefused(mismatches, manifest_path)
    return harness
