"""Evaluation items and versioned sets: the data every set kind, the runner and the report share.

An `EvalItem` is plain, frozen, JSON-serialisable data: which set it belongs to, its family
(reported separately), the simulator scenario it runs (agent sets) or the prompt it answers
(the general set), how its Harness differs from the released one (`harness`), and what its
scorer expects beyond the scenario's gold (`expect`). An `EvalSet` is an ordered tuple of
items with a version: the hash of the generator's settings and every item's content, so two
runs are comparable only when they evaluated the same version.

The set also records the live room it was built for (`EvalContext.room`): the agent sets'
items are that room's scenarios (so their content, and the version, differ between rooms), and
`ensure_set` and the runner refuse a set of one room under another, even one whose items do not
depend on the room (the general set).

On disk a set is a folder `<sets_dir>/<name>/` holding `items.jsonl` and `manifest.json`
(name, version, room, generator settings, one content hash per item), both written atomically;
a manifest written before rooms existed reads as the "v0" room.
Reading checks every item against its manifest hash; a changed or corrupt file is an error that
names the item or line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from hat_jax import files
from hat_jax import harness as hx

ITEMS_FILE = "items.jsonl"
MANIFEST_FILE = "manifest.json"
DEFAULT_ROOM = "v0"  # the room of a set whose manifest names none (written before rooms)


class SetVersionError(ValueError):
    """A set on disk is not the version asked for (or two runs evaluated different versions)."""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def stable_seed(*parts: Any, width: int = 4) -> int:
    """A seed derived from `parts` (stable across processes and platforms): the first `width`
    bytes of the sha256 of their `|`-joined text."""
    return int.from_bytes(
        hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:width], "big"
    )


def content_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj` (sorted keys, no whitespace)."""
    return hashlib.sha256(_canonical(obj).encode()).hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalItem:
    """One evaluation item.

    Attributes:
      id: unique within its set.
      set: the set's name (e.g. "t1").
      family: the family it is reported under (a scenario family, an instruction type ...).
      scenario: an `rl.sim.Scenario` as a dict (agent sets), else None.
      prompt: for single-call items (the general set): `{"messages": [...], ...}`, else None.
      harness: how the item's Harness state derives from the released Harness ({} = unchanged);
        the keys are the set kind's own.
      expect: what the set's scorer checks beyond the scenario's gold; the set kind's own keys.
    """

    id: str
    set: str
    family: str
    scenario: Mapping[str, Any] | None = None
    prompt: Mapping[str, Any] | None = None
    harness: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    expect: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.id or not self.set or not self.family:
            raise ValueError(f"EvalItem needs id, set and family, got {self.to_dict()!r:.200}")
        if (self.scenario is None) == (self.prompt is None):
            raise ValueError(f"EvalItem {self.id}: give exactly one of scenario and prompt")
        for name in ("scenario", "prompt", "harness", "expect"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, hx.freeze(dict(value)))

    @property
    def agent(self) -> bool:
        """Whether the item runs the agent loop (a scenario) rather than one model call."""
        return self.scenario is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "set": self.set,
            "family": self.family,
            "scenario": hx.thaw(self.scenario) if self.scenario is not None else None,
            "prompt": hx.thaw(self.prompt) if self.prompt is not None else None,
            "harness": hx.thaw(self.harness),
            "expect": hx.thaw(self.expect),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalItem:
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"EvalItem: unknown field(s) {unknown}")
        return cls(**d)

    def digest(self) -> str:
        return content_hash(self.to_dict())


@dataclasses.dataclass(frozen=True)
class EvalSet(Sequence[EvalItem]):
    """A named, versioned, ordered collection of items.

    Attributes:
      name: the set's name.
      items: the items, in evaluation order.
      generator: the settings the set was built with (seeds, sizes, bank splits ...).
      room: the live room it was built for (`EvalContext.room`). Not part of the version,
        which its items' content already makes room-specific, so the v0 sets keep theirs.
    """

    name: str
    items: tuple[EvalItem, ...]
    generator: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    room: str = DEFAULT_ROOM

    def __post_init__(self):
        object.__setattr__(self, "items", tuple(self.items))
        object.__setattr__(self, "generator", hx.freeze(dict(self.generator)))
        ids = [i.id for i in self.items]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise ValueError(f"set {self.name}: duplicate item ids {dup}")
        wrong = [i.id for i in self.items if i.set != self.name][:5]
        if wrong:
            raise ValueError(f"set {self.name}: items of another set {wrong}")

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[EvalItem]:
        return iter(self.items)

    @property
    def version(self) -> str:
        """`<name>-<12 hex>`: the hash of the generator settings and every item's content."""
        h = content_hash({"generator": hx.thaw(self.generator),
                          "items": [i.digest() for i in self.items]})  # fmt: skip
        return f"{self.name}-{h[:12]}"

    def manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "room": self.room,
            "generator": hx.thaw(self.generator),
            "count": len(self.items),
            "families": _counts(i.family for i in self.items),
            "items": [{"id": i.id, "sha256": i.digest()} for i in self.items],
        }

    def get(self, item_id: str) -> EvalItem:
        for item in self.items:
            if item.id == item_id:
                return item
        raise KeyError(f"set {self.name}: no item {item_id!r}")


def _counts(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def check_room(eval_set: EvalSet, room: str, where: str) -> None:
    """Refuses a set built for another live room than `room` (`where` names the caller).

    Raises:
      SetVersionError: naming the set, the room it was built for and `room`.
    """
    if eval_set.room != room:
        raise SetVersionError(
            f"{where}: {eval_set.version} was built for the {eval_set.room!r} live room, not "
            f"{room!r}: a set of one room is never evaluated as another's"
        )


def write_set(sets_dir: os.PathLike | str, eval_set: EvalSet) -> pathlib.Path:
    """Writes `<sets_dir>/<name>/items.jsonl` and `manifest.json` atomically; returns the folder."""
    folder = pathlib.Path(sets_dir) / eval_set.name
    files.write_jsonl(
        folder / ITEMS_FILE, (json.dumps(i.to_dict(), ensure_ascii=False) for i in eval_set)
    )
    files.write_json(folder / MANIFEST_FILE, eval_set.manifest())
    return folder


def read_set(folder: os.PathLike | str, *, version: str | None = None) -> EvalSet:
    """Reads a set folder, checking every item against its manifest.

    Args:
      folder: `<sets_dir>/<name>`.
      version: when given, the version the set must have.

    Raises:
      FileNotFoundError: the folder, its items or its manifest are missing.
      SetVersionError: the set is another version than `version`, or an item differs from its
        manifest hash (named).
    """
    folder = pathlib.Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no evaluation set in {folder} (missing {MANIFEST_FILE})")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    items = list(files.read_jsonl(folder / ITEMS_FILE, EvalItem.from_dict, what="eval item"))
    listed = [(e["id"], e["sha256"]) for e in manifest["items"]]
    got = [(i.id, i.digest()) for i in items]
    if listed != got:
        bad = next(
            (a[0] for a, b in zip(listed, got, strict=False) if a != b),
            f"{len(listed)} listed vs {len(got)} read",
        )
        raise SetVersionError(
            f"{folder / ITEMS_FILE} does not match its manifest (first difference: {bad})"
        )
    out = EvalSet(manifest["name"], tuple(items), manifest.get("generator", {}),
                  room=manifest.get("room", DEFAULT_ROOM))  # fmt: skip
    if out.version != manifest["version"]:
        raise SetVersionError(f"{folder}: manifest version {manifest['version']} != {out.version}")
    if version is not None and out.version != version:
        raise SetVersionError(f"{folder} holds {out.version}, not the requested {version}")
    return out
