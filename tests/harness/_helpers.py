"""Helpers shared by the Harness runtime tests."""

import dataclasses

from hat_jax import harness as hx


class Spy:
    """A toolbox wrapper that records every executor call (canonical name, arguments)."""

    def __init__(self, toolbox):
        self.calls: list[tuple[str, dict]] = []
        self.toolbox = hx.Toolbox({n: self._wrap(n, fn) for n, fn in toolbox.items()})

    def _wrap(self, name, fn):
        def run(args):
            self.calls.append((name, dict(args)))
            return fn(args)

        return run

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


def with_hook(harness: hx.Harness, name: str, **changes) -> hx.Harness:
    """Harness copy with hook `name` changed (e.g. action, max_retries, params, enabled)."""
    hooks = tuple(
        dataclasses.replace(h, **changes) if h.name == name else h for h in harness.hooks.hooks
    )
    return dataclasses.replace(harness, hooks=dataclasses.replace(harness.hooks, hooks=hooks))


def turn(*calls, content: str = "", reasoning: str = "", parse_errors=()) -> hx.AssistantTurn:
    return hx.AssistantTurn(
        content=content, reasoning=reasoning, tool_calls=calls, parse_errors=parse_errors
    )


def tool_results(traj: hx.Trajectory, name: str) -> list:
    """Results (parsed tool records) of every call to canonical tool `name`."""
    return [r for r in traj.tool_calls if r.canonical == name or r.name == name]
