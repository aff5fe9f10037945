"""The set kinds, and building each set once into a folder of versioned sets.

    sets = ensure_sets(["t1", "t2"], ctx, sets_dir="runs/eval/sets", sizes={"t1": 26})

`ensure_set` builds a set from its kind's generator and writes it the first time; afterwards it
reads the stored set and checks that it was built for the context's live room and that the
generator still produces the same version, so a set never changes silently under a series of
runs (nor passes for another room's). A pinned `version` that the folder does not hold is an
error that names what it holds. Keep one `sets_dir` per room.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence

from hat_jax.eval._general import GENERAL
from hat_jax.eval._ifeval_set import IFEVAL
from hat_jax.eval._items import MANIFEST_FILE, EvalSet, SetVersionError, read_set, write_set
from hat_jax.eval._kind import EvalContext, SetKind, set_name
from hat_jax.eval._qa_sets import T1, T2
from hat_jax.eval._robustness import T3_PROMPT, T3_TOOL

KINDS: dict[str, SetKind] = {k.name: k for k in (T1, T2, T3_TOOL, T3_PROMPT, GENERAL, IFEVAL)}
SPLITS = ("dev", "test")
# Sizes of the demo's sets: small enough for the tiny model on two CPU cores.
DEFAULT_SIZES = {"t1": 26, "t2": 26, "t3_tool": 26, "t3_prompt": 26, "general": 40, "ifeval": 541}


def ensure_set(
    kind: str,
    ctx: EvalContext,
    *,
    sets_dir: os.PathLike | str,
    split: str = "test",
    size: int | None = None,
    seed: int = 0,
    version: str | None = None,
) -> EvalSet:
    """The set `kind` of `split`, built and written once under `sets_dir`.

    Args:
      kind: a name of `KINDS`.
      ctx: the released world and Harness.
      sets_dir: the folder of stored sets.
      split: "test" (the reported sets) or "dev" (for Harness evolution).
      size: items (default `DEFAULT_SIZES[kind]`).
      seed: the generator's seed.
      version: when given, the version the stored set must have.

    Raises:
      SetVersionError: the stored set was built for another live room than `ctx.room`, or is
        another version than the generator gives now or than `version` (both named).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown evaluation set {kind!r}; known: {sorted(KINDS)}")
    if split not in SPLITS:
        raise ValueError(f"evaluation split must be one of {SPLITS}, got {split!r}")
    folder = pathlib.Path(sets_dir) / set_name(kind, split)
    if version is not None and not (folder / MANIFEST_FILE).is_file():
        raise SetVersionError(f"set version {version} is not stored: {folder} does not exist")
    stored = read_set(folder, version=version) if (folder / MANIFEST_FILE).is_file() else None
    if stored is not None and stored.room != ctx.room:
        raise SetVersionError(
            f"{folder} holds a set built for the {stored.room!r} live room, not {ctx.room!r}: "
            f"use another sets_dir for the {ctx.room!r} room (one sets_dir per room)"
        )
    built = KINDS[kind].build(ctx, split=split, size=size or DEFAULT_SIZES[kind], seed=seed)
    if stored is None:
        write_set(sets_dir, built)
        return built
    if stored.version != built.version:
        raise SetVersionError(
            f"{folder} holds {stored.version} but these settings build {built.version} "
            "(another size, seed, or a changed generator): use another sets_dir to keep both"
        )
    return stored


def ensure_sets(
    kinds: Sequence[str],
    ctx: EvalContext,
    *,
    sets_dir: os.PathLike | str,
    split: str = "test",
    sizes: Mapping[str, int] | None = None,
    seed: int = 0,
    versions: Mapping[str, str] | None = None,
) -> list[EvalSet]:
    """`ensure_set` for several kinds (sizes and pinned versions by kind)."""
    sizes, versions = dict(sizes or {}), dict(versions or {})
    unknown = sorted((set(sizes) | set(versions)) - set(KINDS))
    if unknown:
        raise ValueError(f"sizes/versions name unknown sets {unknown}; known: {sorted(KINDS)}")
    return [
        ensure_set(
            k,
            ctx,
            sets_dir=sets_dir,
            split=split,
            size=sizes.get(k),
            seed=seed,
            version=versions.get(k),
        )  # fmt: skip
        for k in kinds
    ]
