"""Tool executors keyed by canonical name (`Toolbox`).

A `Toolbox` maps canonical tool names to executors `fn(arguments) -> JSON value`. The loop
resolves the policy's (surface) tool name through the `HarnessState` first, so executors never
see renamed names, and fills context arguments (`viewer_id`, ...) from the request. An executor
signals an expected failure by raising `ToolError` / `ToolDenied`; anything else it raises is
recorded as a fault and returned to the policy as an error result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

Executor = Callable[[dict[str, Any]], Any]


class Toolbox(Mapping[str, Executor]):
    """An immutable mapping canonical tool name -> executor.

    Args:
      executors: executors by canonical name.
      inline: names of executors that only compute in memory and cannot block; the loop runs
        them on its own thread (deadline checked afterwards) instead of a worker thread.
    """

    def __init__(
        self, executors: Mapping[str, Executor] | None = None, *, inline: Iterable[str] = ()
    ):
        for name, fn in (executors or {}).items():
            if not callable(fn):
                raise TypeError(f"executor for {name!r} is not callable")
        self._executors = MappingProxyType(dict(executors or {}))
        self._inline = frozenset(inline)
        if unknown := self._inline - set(self._executors):
            raise ValueError(f"inline names without an executor: {sorted(unknown)}")

    def __getitem__(self, name: str) -> Executor:
        return self._executors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._executors)

    def __len__(self) -> int:
        return len(self._executors)

    def is_inline(self, name: str) -> bool:
        return name in self._inline

    def merged(self, other: Mapping[str, Executor]) -> Toolbox:
        """A new Toolbox with `other`'s executors added (a name in both is an error)."""
        clash = set(self) & set(other)
        if clash:
            raise ValueError(f"executors defined twice: {sorted(clash)}")
        inline = self._inline | (other._inline if isinstance(other, Toolbox) else frozenset())
        return Toolbox({**self._executors, **other}, inline=inline)

    def __repr__(self) -> str:
        return f"Toolbox({sorted(self)})"
