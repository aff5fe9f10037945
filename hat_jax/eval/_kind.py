"""What a kind of evaluation set supplies: how to build it, run an item, and score it.

Each set kind (`t1`, `t2`, `t3_tool`, `t3_prompt`, `general`) is a `SetKind` object listed
explicitly in `hat_jax.eval._sets.KINDS`. The runner knows nothing about any of them beyond
this interface:

- `build(ctx, *, split, size, seed)` -> `EvalSet`: deterministic in its arguments and the
  bundled world; the generator settings go into the set's manifest.
- `prepare(item, ctx)` -> `Prepared`: the Harness state, tools and request an agent item runs
  under (a fresh sandbox per call), or the messages of a single-call item.
- `score(item, prepared, result)` -> `{metric: value}` in [0, 1] with `"avg"` among them: the
  item's headline figure (the paper's per-sample mean of the set's metrics). `result` is the
  `hat_jax.harness.Trajectory` of an agent item, or the `AssistantTurn` of a single-call one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from hat_jax import harness as hx
from hat_jax.eval._items import EvalItem, EvalSet


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """The released world and Harness every set derives from.

    Attributes:
      world: the world tools answer from.
      harness: the released Harness (the "original" of T1).
      limits: the agent loop's limits for agent items.
    """

    world: hx.World
    harness: hx.Harness
    limits: hx.Limits = dataclasses.field(default_factory=hx.Limits)

    @classmethod
    def default(cls) -> EvalContext:
        """The bundled world and its Harness v0."""
        world = hx.load_world(hx.default_world_dir())
        return cls(world=world, harness=hx.load(world.root))


@dataclasses.dataclass
class Prepared:
    """What one item runs with.

    Attributes:
      state: the Harness state (agent items), or the released Harness's (single-call items).
      request: the agent loop's request (agent items).
      tools: the executors on canonical names (agent items); a fresh sandbox per `prepare`.
      messages: the conversation of a single-call item.
      scenario: the `rl.sim.Scenario` of an agent item.
      extra: anything else the kind's scorer needs (e.g. the sandbox).
    """

    state: hx.HarnessState
    request: hx.Request | None = None
    tools: hx.Toolbox | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    scenario: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class SetKind(Protocol):
    """A kind of evaluation set (see the module docstring)."""

    name: str
    metrics: tuple[str, ...]  # the per-item score keys, "avg" included

    def build(self, ctx: EvalContext, *, split: str, size: int, seed: int) -> EvalSet: ...

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared: ...

    def score(self, item: EvalItem, prepared: Prepared, result: Any) -> dict[str, float]: ...


def set_name(kind: str, split: str) -> str:
    """The name a kind's build of a split gets: the test split is the plain kind name."""
    return kind if split == "test" else f"{kind}-{split}"


Scorer = Callable[[EvalItem, Prepared, Any], dict[str, float]]
