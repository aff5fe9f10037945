"""Checkpoint digests: one sha256 that names exactly the weights, config and tokenizer a policy
ran with, so evidence (an evaluation, a replay) can be bound to the checkpoint released.

    digest = checkpoint_digest("runs/demo/export/hf")       # "sha256:…"
    verify_digest("runs/demo/export/hf")                   # recomputed; a stale manifest raises

What is hashed (`digest_files`):
- an HF directory: every regular file under it (weights, `config.json`,
  `generation_config.json`, the index, the tokenizer files, the `mtp.*` shards), except the
  digest manifest itself and hidden paths (`.cache/`, editor files);
- an Orbax checkpoint (a `save_params` directory, a training step or a run's `checkpoints/`,
  resolved to the step that loads): its `params` item and the model config beside it, not the
  optimizer state or data iterator of a training step;
- a tokenizer directory (`tokenizer_digest`): the tokenizer files an export copies.

Each file is hashed on its own, streaming in 8 MiB blocks (nothing is held whole in memory);
the digest is the sha256 of the sorted lines `<relative path>\\0<file sha256>\\n`, so a changed
byte, a renamed file, an added or a removed one all change it. The HF export
(`serve.convert.save_hf`) writes the result as `hat_digest.json` (the digest and each file's
size, mtime and sha256). `checkpoint_digest` trusts that manifest only while every file's size
and mtime are those it recorded and none has an mtime at or after the manifest's own (a write
in the manifest's clock tick cannot be told from one before it); otherwise it hashes the files.
`verify_digest` always hashes them and names the files a stale manifest disagrees on.

Deliberately not here: what the digests are compared for (the release gates, `serve.release`).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from hat_jax import files

DIGEST_FILE = "hat_digest.json"
ALGORITHM = "sha256 of sorted '<path>\\0<file sha256>\\n' lines"
_BLOCK = 8 * 2**20
# The tokenizer files of a tokenizer directory (the ones `serve.convert.save_hf` copies).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


class DigestMismatchError(ValueError):
    """A stored digest manifest no longer matches the files beside it."""


def _is_hf_dir(path: pathlib.Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _tree(root: pathlib.Path, top: pathlib.Path | None = None) -> dict[str, pathlib.Path]:
    """Regular files under `top` (default `root`), keyed by their path relative to `root`."""
    out = {}
    for path in sorted((top or root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not any(part.startswith(".") for part in rel.split("/")):
            out[rel] = path
    return out


def digest_files(checkpoint: os.PathLike | str) -> tuple[pathlib.Path, dict[str, pathlib.Path]]:
    """`(root, {relative path: file})`: the files that make up a checkpoint (see the module
    docstring); `root` is the directory that loads (an Orbax run's latest step).

    Raises:
      FileNotFoundError: `checkpoint` does not exist.
      CheckpointError: an Orbax directory without a `params` item.
    """
    path = pathlib.Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_file():
        return path.parent, {path.name: path}
    if _is_hf_dir(path):
        tree = _tree(path)
        tree.pop(DIGEST_FILE, None)
        return path, tree
    # The layout `hat_jax.checkpoint.restore_params` reads (imported here: it loads Orbax).
    from hat_jax.checkpoint._params import (
        MODEL_CONFIG_FILE,
        MODEL_CONFIG_ITEM,
        PARAMS_ITEM,
        resolve_params_dir,
    )

    root = resolve_params_dir(path)
    tree = _tree(root, root / PARAMS_ITEM)
    if (root / MODEL_CONFIG_FILE).is_file():
        tree[MODEL_CONFIG_FILE] = root / MODEL_CONFIG_FILE
    elif (root / MODEL_CONFIG_ITEM).is_dir():
        tree.update(_tree(root, root / MODEL_CONFIG_ITEM))
    return root, dict(sorted(tree.items()))


def file_sha256(path: pathlib.Path) -> str:
    """The sha256 of one file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def combine(hashes: Mapping[str, str]) -> str:
    """The digest of `{relative path: file sha256}` ("sha256:<hex>")."""
    h = hashlib.sha256()
    for rel in sorted(hashes):
        h.update(f"{rel}\0{hashes[rel]}\n".encode())
    return f"sha256:{h.hexdigest()}"


def compute_manifest(checkpoint: os.PathLike | str) -> dict[str, Any]:
    """Hashes every file of a checkpoint: `{"digest", "algorithm", "files": {path: {size,
    mtime_ns, sha256}}}`."""
    _, tree = digest_files(checkpoint)
    entries = {}
    for rel, path in tree.items():
        st = path.stat()
        entries[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(path)}
    return {
        "digest": combine({rel: e["sha256"] for rel, e in entries.items()}),
        "algorithm": ALGORITHM,
        "files": entries,
    }


def write_digest(hf_dir: os.PathLike | str) -> str:
    """Hashes an HF directory and writes its manifest (`DIGEST_FILE`, atomically); returns the
    digest. `serve.convert.save_hf` calls it last."""
    manifest = compute_manifest(hf_dir)
    files.write_json(pathlib.Path(hf_dir) / DIGEST_FILE, manifest)
    return manifest["digest"]


def read_manifest(checkpoint: os.PathLike | str) -> dict[str, Any] | None:
    """The stored manifest of an HF directory (None when there is none or it is unreadable)."""
    path = pathlib.Path(checkpoint) / DIGEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and isinstance(manifest.get("files"), dict)
    return manifest if ok and isinstance(manifest.get("digest"), str) else None


def _stored_still_holds(checkpoint: pathlib.Path, manifest: Mapping[str, Any]) -> bool:
    """Whether the files are those the manifest recorded, by size and mtime (no hashing)."""
    _, tree = digest_files(checkpoint)
    recorded = manifest["files"]
    if sorted(tree) != sorted(recorded):
        return False
    written = (checkpoint / DIGEST_FILE).stat().st_mtime_ns
    for rel, path in tree.items():
        st, entry = path.stat(), recorded[rel]
        if (st.st_size, st.st_mtime_ns) != (entry.get("size"), entry.get("mtime_ns")):
            return False
        if st.st_mtime_ns >= written:  # written in the manifest's clock tick, or after it
            return False
    return True


def checkpoint_digest(checkpoint: os.PathLike | str, *, recompute: bool = False) -> str:
    """The digest of a checkpoint: the stored manifest's while it still holds, else (or with
    `recompute`) hashed from the files. Raises FileNotFoundError for a missing checkpoint."""
    path = pathlib.Path(checkpoint)
    manifest = None if recompute or not path.is_dir() else read_manifest(path)
    if manifest is not None and _stored_still_holds(path, manifest):
        return manifest["digest"]
    return compute_manifest(path)["digest"]


def verify_digest(checkpoint: os.PathLike | str) -> str:
    """Hashes a checkpoint's files and returns the digest.

    Raises:
      DigestMismatchError: a stored manifest records another digest; the message names both
        and the files changed, added and removed since it was written.
    """
    fresh = compute_manifest(checkpoint)
    stored = read_manifest(checkpoint) if pathlib.Path(checkpoint).is_dir() else None
    if stored is None or stored["digest"] == fresh["digest"]:
        return fresh["digest"]
    old, new = stored["files"], fresh["files"]
    changed = [r for r in new if r in old and old[r].get("sha256") != new[r]["sha256"]]
    problems = [f"{what} {names[:5]}" for what, names in (
        ("changed", changed),
        ("added", [r for r in new if r not in old]),
        ("removed", [r for r in old if r not in new]),
    ) if names]  # fmt: skip
    raise DigestMismatchError(
        f"{checkpoint}: its {DIGEST_FILE} records {stored['digest']} but its files hash to "
        f"{fresh['digest']} ({'; '.join(problems) or 'the recorded hashes differ'})"
    )


def tokenizer_digest(tokenizer_dir: os.PathLike | str) -> str:
    """The digest of a tokenizer directory's tokenizer files (`TOKENIZER_FILES`)."""
    root = pathlib.Path(tokenizer_dir)
    present = [n for n in TOKENIZER_FILES if (root / n).is_file()]
    if not present:
        raise FileNotFoundError(f"{root} holds none of the tokenizer files {TOKENIZER_FILES}")
    return combine({n: file_sha256(root / n) for n in present})
