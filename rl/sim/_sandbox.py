"""Sandboxed tool executors with fault injection (paper §3.3, "sandboxed tool execution").

Executors answer from the bundled world on canonical names, exactly as the production tools
would: the built-in retrieval and commerce tools are the Harness's own (`builtin_toolbox`);
the marketing tools run the bundled MCP service's campaign logic (`MarketingService`) against a
ledger that lives for one episode, so every episode starts from the same state and is reproducible (the service
itself keeps one ledger per process). Renamed tools never reach an executor: the agent loop
resolves surface names through the `HarnessState` first.

Faults are drawn per call from a seeded generator: timeouts (reported by the tool, or real ones
that run past the loop's per-call deadline), malformed results (values the after-tool hook
must catch: NaN, nesting too deep, non-JSON data) and permission denials. With
`persistent=False` a given call fails at most once per episode, so retrying it recovers.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from hat_jax import harness as hx
from hat_jax import livestream

FAULT_KINDS = ("timeout", "malformed", "denied")
MALFORMED_KINDS = ("nan", "deep", "not_json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultConfig:
    """Fault-injection rates and behaviour.

    Attributes:
      timeout: probability that a call times out.
      malformed: probability that a call returns a malformed result.
      denied: probability that a call is refused (permission denied).
      tools: canonical tools faults may hit (default: every executor).
      persistent: if False, each distinct call (tool and arguments) fails at most once per
        episode, so a retry succeeds; if True, every attempt draws again.
      real_timeouts: make a timeout a real delay of `sleep_s` (past the loop's per-call limit)
        instead of an error the tool reports at once.
      sleep_s: length of a real timeout.
    """

    timeout: float = 0.0
    malformed: float = 0.0
    denied: float = 0.0
    tools: tuple[str, ...] | None = None
    persistent: bool = False
    real_timeouts: bool = False
    sleep_s: float = 0.5

    def __post_init__(self):
        rates = (self.timeout, self.malformed, self.denied)
        if any(r < 0 for r in rates) or sum(rates) > 1:
            raise ValueError(f"fault rates must be >= 0 and sum to <= 1, got {rates}")
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def active(self) -> bool:
        return self.timeout + self.malformed + self.denied > 0


@dataclasses.dataclass(frozen=True)
class InjectedFault:
    """A fault the sandbox injected: which call (0-based order), tool, arguments, kind."""

    call: int
    tool: str
    arguments: Mapping[str, Any]
    kind: str
    detail: str = ""


class _Nested:
    """Marker for a malformed result that is not JSON data at all."""

    def __repr__(self) -> str:
        return "<unserialisable result>"


def _malformed(kind: str) -> Any:
    if kind == "nan":
        return {"status": "ok", "value": float("nan")}
    if kind == "deep":
        value: Any = {"data": "truncated"}
        for _ in range(12):
            value = {"data": value}
        return value
    return {"status": "ok", "payload": _Nested()}


class Sandbox:
    """One episode's executors (a `Toolbox` on canonical names) and the faults they injected.

    Args:
      world: the world the tools answer from.
      faults: fault-injection settings.
      seed: seeds the fault draws; the same seed and the same sequence of calls give the same
        faults.
    """

    def __init__(
        self, world: livestream.World, *, faults: FaultConfig | None = None, seed: int = 0
    ):
        self.world, self.faults = world, faults or FaultConfig()
        self.rng = random.Random(seed)
        self.injected: list[InjectedFault] = []
        self._calls = 0
        self._failed: set[str] = set()
        base: dict[str, Callable[[dict[str, Any]], Any]] = dict(livestream.builtin_toolbox(world))
        base.update(livestream.MarketingService(world).executors())  # a fresh ledger per episode
        # In-memory lookups run on the loop's own thread; real timeouts must run on a worker
        # so the loop's per-call deadline can cut them off.
        inline = () if self.faults.real_timeouts else tuple(base)
        self.tools = hx.Toolbox(
            {name: self._wrap(name, fn) for name, fn in base.items()}, inline=inline
        )

    def _wrap(self, name: str, fn: Callable[[dict[str, Any]], Any]):
        def execute(args: dict[str, Any]) -> Any:
            index, self._calls = self._calls, self._calls + 1
            kind = self._draw(name, args)
            if kind is None:
                return fn(args)
            return self._inject(index, name, args, kind)

        return execute

    def _draw(self, name: str, args: Mapping[str, Any]) -> str | None:
        f = self.faults
        if not f.active or (f.tools is not None and name not in f.tools):
            return None
        key = f"{name}:{json.dumps(args, sort_keys=True, default=str)}"
        u = self.rng.random()
        if not f.persistent and key in self._failed:
            return None
        kind = None
        if u < f.timeout:
            kind = "timeout"
        elif u < f.timeout + f.malformed:
            kind = "malformed"
        elif u < f.timeout + f.malformed + f.denied:
            kind = "denied"
        if kind is not None:
            self._failed.add(key)
        return kind

    def _inject(self, index: int, name: str, args: dict[str, Any], kind: str) -> Any:
        detail = ""
        if kind == "malformed":
            detail = self.rng.choice(MALFORMED_KINDS)
        self.injected.append(InjectedFault(index, name, dict(args), kind, detail))
        if kind == "timeout":
            if self.faults.real_timeouts:
                time.sleep(self.faults.sleep_s)
                return {"late": True}
            raise hx.ToolTimeout(f"{name} did not answer in time")
        if kind == "denied":
            raise hx.ToolDenied(f"permission denied: {name} is not available right now")
        return _malformed(detail)
