"""Viewer-comment phrasings: the template files `rl.sim` builds scenarios from.

A phrasing file lists templates per scenario family. A template is written out (`text`, or
`comments` for a multi-comment request) with its split, or composed: `compose` gives lists of
parts (for several comments, `compose_comments` one such list per comment) and every
combination of one part from each list is a phrasing. The combinations of a composed template
are split deterministically: first enough of them to training that every part occurs in a
training phrasing, then training up to `1 - held_out` of them, the rest alternately to dev and
test. So a held-out phrasing is never a training phrasing, yet every word of it occurs in
training phrasings (`vocabulary_gaps` checks a whole file): a comment language a model without
pretraining can generalise in, which the micro live room uses. Written-out templates keep the
split their author gave (Harness v0's phrasings hold out whole sentences).
"""

from __future__ import annotations

import hashlib
import itertools
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from rl.sim import _intents
from rl.sim._scenario import FAMILIES, SPLITS

DEFAULT_HELD_OUT = 0.4
MAX_COMBINATIONS = 64
_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)
_SLOT = re.compile(r"\{[a-z_]+\}")


def _h(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def words(text: str) -> set[str]:
    """The lower-cased words of a phrasing, slots (`{ref}`) left out."""
    return {w.lower() for w in _WORD.findall(_SLOT.sub(" ", text))}


def _texts(t: Mapping[str, Any]) -> list[str]:
    return list(t.get("comments") or [t["text"]])


def _compose(t: Mapping[str, Any], where: str, problems: list[str]) -> list[dict[str, Any]]:
    """The written-out templates of one composed template (see module docstring)."""
    multi = "compose_comments" in t
    groups = t["compose_comments"] if multi else [t["compose"]]
    if (
        not isinstance(groups, list)
        or not groups
        or not all(
            isinstance(g, list) and g and all(isinstance(p, list) and p for p in g) for g in groups
        )
    ):
        problems.append(f"{where}: compose needs non-empty lists of non-empty part lists")
        return []
    held_out = float(t.get("held_out", DEFAULT_HELD_OUT))
    if not 0.0 <= held_out < 1.0:
        problems.append(f"{where}: held_out must be in [0, 1), got {held_out}")
        return []
    lists = [[str(p) for p in parts] for g in groups for parts in g]
    bounds = list(itertools.accumulate(len(g) for g in groups))
    combos, seen = [], set()
    for choice in itertools.product(*(range(len(p)) for p in lists)):
        pieces = [lists[k][c] for k, c in enumerate(choice)]
        comments = tuple(
            " ".join("".join(pieces[a:b]).split())
            for a, b in zip([0, *bounds[:-1]], bounds, strict=True)
        )
        if comments not in seen:
            seen.add(comments)
            combos.append((choice, comments))
    combos.sort(key=lambda c: _h(t["id"], c[1]))
    splits = _split_combinations([c for c, _ in combos], held_out, int(t.get("max", 0)) or None)
    out = []
    base = {
        k: v for k, v in t.items() if k not in ("compose", "compose_comments", "held_out", "max")
    }
    for n, ((_, comments), split) in enumerate(zip(combos, splits, strict=True)):
        if split is None:
            continue
        item = dict(base, id=f"{t['id']}-{n:03d}", split=split)
        item.update({"comments": list(comments)} if multi else {"text": comments[0]})
        out.append(item)
    return out


def _split_combinations(
    choices: Sequence[tuple[int, ...]], held_out: float, limit: int | None
) -> list[str | None]:
    """Split per combination (in the given order): coverage of every part by training first,
    then training up to `1 - held_out`, then dev and test alternately; None past `limit`."""
    limit = min(len(choices), limit or MAX_COMBINATIONS)
    covered: set[tuple[int, int]] = set()
    needed = {(k, c) for choice in choices for k, c in enumerate(choice)}
    out: list[str | None] = [None] * len(choices)
    for n, choice in enumerate(choices):
        parts = {(k, c) for k, c in enumerate(choice)}
        if not parts <= covered:
            out[n], covered = "train", covered | parts
        if covered == needed:
            break
    train = max(sum(s == "train" for s in out), round(limit * (1.0 - held_out)))
    held = 0
    for n in range(len(choices)):
        if out[n] is not None:
            continue
        if sum(s is not None for s in out) >= limit:
            break
        if sum(s == "train" for s in out) < train:
            out[n] = "train"
        else:
            out[n], held = ("dev", "test")[held % 2], held + 1
    return out


def load_phrasings(path: str | pathlib.Path) -> dict[str, Any]:
    """Reads and checks a phrasing file, composed templates written out (errors name the
    template)."""
    path = pathlib.Path(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    problems: list[str] = []
    families = {}
    for family, templates in (data.get("families") or {}).items():
        if family not in FAMILIES:
            problems.append(f"{path}: unknown family {family!r}")
            continue
        out = []
        for t in templates:
            where = f"{path}: {family}/{t.get('id')}"
            composed = "compose" in t or "compose_comments" in t
            written = ("text" in t) + ("comments" in t)
            if composed + written != 1 or ("compose" in t and "compose_comments" in t):
                problems.append(
                    f"{where}: give exactly one of 'text', 'comments', 'compose' or "
                    "'compose_comments'"
                )
                continue
            unknown = [k for k in t.get("intents", ()) if k not in _intents.KINDS]
            if unknown or not t.get("intents"):
                problems.append(f"{where}: unknown or missing intents {unknown}")
            if composed:
                if "split" in t:
                    problems.append(f"{where}: a composed template's splits are drawn, not given")
                out += _compose(t, where, problems)
            elif t.get("split") not in SPLITS:
                problems.append(f"{where}: split must be one of {SPLITS}")
            else:
                out.append(t)
        families[family] = out
    missing = sorted(set(FAMILIES) - set(families))
    if missing:
        problems.append(f"{path}: no templates for families {missing}")
    ids = [t.get("id") for ts in families.values() for t in ts]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        problems.append(f"{path}: duplicate template ids {dup}")
    if problems:
        raise ValueError("invalid phrasings:\n  " + "\n  ".join(problems))
    return {**data, "families": families}


def vocabulary_gaps(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """Held-out phrasings (id -> words) with words no training phrasing of the file uses, and
    held-out phrasings that are training phrasings (id -> ["<same as training>"])."""
    templates = [t for ts in data["families"].values() for t in ts]
    train = [tuple(_texts(t)) for t in templates if t["split"] == "train"]
    vocab = set().union(*(words(x) for texts in train for x in texts))
    out = {}
    for t in templates:
        if t["split"] == "train":
            continue
        texts = tuple(_texts(t))
        if texts in train:
            out[t["id"]] = ["<same as training>"]
            continue
        gap = sorted(set().union(*(words(x) for x in texts)) - vocab)
        if gap:
            out[t["id"]] = gap
    return out


def template_texts(data: Mapping[str, Any], split: str) -> Iterable[str]:
    """Every comment text of the templates of one split."""
    for ts in data["families"].values():
        for t in ts:
            if t["split"] == split:
                yield from _texts(t)
