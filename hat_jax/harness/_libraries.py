"""Libraries a Harness names by module: what its hooks and prompt blocks need beyond the runtime.

A Harness stays data: hooks.yaml and prompt.yaml list dotted module names under `libraries`,
and each module exposes its library under a fixed attribute (`CHECKS` for hook checks,
`BLOCKS` for prompt context blocks). Nothing is registered on import; the runtime asks for a
library when it validates or runs a Harness (Python imports a module once).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class LibraryError(ValueError):
    """A library named by a Harness cannot be used (not importable, missing, a name clash)."""


class NamedSet(Mapping[str, T]):
    """A named, read-only mapping that its defining module fills with a decorator."""

    def __init__(self, name: str):
        self.name = name
        self._items: dict[str, T] = {}

    def _add(self, key: str, value: T) -> None:
        if key in self._items:
            raise ValueError(f"{key!r} defined twice in library {self.name!r}")
        self._items[key] = value

    def __getitem__(self, key: str) -> T:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {sorted(self._items)})"


def library(module: str, attribute: str, kind: type) -> Any:
    """The `attribute` of `module` (a dotted name), which must be a `kind`."""
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise LibraryError(f"library {module!r} cannot be imported: {err}") from err
    found = getattr(mod, attribute, None)
    if not isinstance(found, kind):
        raise LibraryError(f"module {module!r} has no {kind.__name__} named {attribute}")
    return found


def combined(base: Mapping[str, T], modules, attribute: str, kind: type) -> dict[str, T]:
    """`base` plus the libraries of `modules`; a name defined twice is a `LibraryError`."""
    out = dict(base)
    for module in modules:
        lib = library(module, attribute, kind)
        if clash := sorted(set(out) & set(lib)):
            raise LibraryError(f"library {module!r} redefines {clash}")
        out.update(lib)
    return out


class ContextBlocks(NamedSet[Callable[[Any], list[str]]]):
    """Prompt context blocks: source name -> `fn(request_context) -> items`.

    A block's items depend on the request context only (the runtime renders them once per
    context); the runtime's own sources are `skills`, `faqs` and `history`.
    """

    def block(self, name: str):
        """Decorator: adds `fn(context) -> list[str]` as the source `name`."""

        def add(fn):
            self._add(name, fn)
            return fn

        return add
