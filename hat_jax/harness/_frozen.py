"""Deep-frozen JSON values and content hashes for the immutable Harness tree.

Harness modules hold JSON-like data (tool schemas, hook parameters, catalog entries). They are
stored frozen so a `Harness` can be shared between threads, cached by version and copied with
`dataclasses.replace` without aliasing bugs. `FrozenDict` is a `dict` subclass (so `json` and
`isinstance(x, dict)` keep working) that refuses mutation and pickles, which Grain workers need.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


class FrozenDict(dict):
    """An immutable, hashable, picklable `dict`."""

    __slots__ = ("_hash",)

    def _immutable(self, *args, **kwargs):
        raise TypeError("FrozenDict is immutable; build a new one (e.g. with dataclasses.replace)")

    __setitem__ = __delitem__ = __ior__ = _immutable
    clear = pop = popitem = setdefault = update = _immutable

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = hash(canonical_json(self))
            return self._hash

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def freeze(value: Any) -> Any:
    """Returns `value` with every mapping as a `FrozenDict` and every list as a tuple."""
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, Mapping):
        return FrozenDict({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of `freeze`: plain dicts and lists, as JSON and `jsonschema` expect them."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Key-sorted, compact JSON: the byte string content hashes are computed over."""
    return json.dumps(thaw(value), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def content_hash(value: Any) -> str:
    """SHA-256 hex digest of `canonical_json(value)`."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
