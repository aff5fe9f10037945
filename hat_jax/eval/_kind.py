"""What a kind of evaluation set supplies: how to build it, run an item, and score it.

Each set kind (`t1`, `t2`, `t3_tool`, `t3_prompt`, `general`) is a `SetKind` object listed
explicitly in `hat_jax.eval._sets.KINDS`. The runner knows nothing about any of them beyond
this interface:

- `build(ctx, *, split, size, seed)` -> `EvalSet`: deterministic in its arguments, the world
  and the context's room; the generator settings and the room go into the set's manifest.
- `prepare(item, ctx)` -> `Prepared`: the Harness state, tools and request an agent item runs
  under (a fresh sandbox per call), or the messages of a single-call item.
- `score(item, prepared, result)` -> `{metric: value}` in [0, 1] with `"avg"` among them: the
  item's headline figure (the paper's per-sample mean of the set's metrics). `result` is the
  `hat_jax.harness.Trajectory` of an agent item, or the `AssistantTurn` of a single-call one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hat_jax import harness as hx
from hat_jax import livestream
from hat_jax.eval._items import EvalItem, EvalSet, content_hash


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """The released world and Harness every set derives from, and the live room they belong to.

    Attributes:
      world: the world tools answer from.
      harness: the released Harness (the "original" of T1).
      limits: the agent loop's limits for agent items.
      judge: the Final Evaluation Judge: an `rl.rewards.JudgePanel` whose majority labels
        replace the rule scorer's Accuracy and Effectiveness on T1 and T2 (None: the rules).
        Keep it apart from the RL reward judge (its own endpoints, prompts and cache).
      judge_on_failure: "fail" (an item no judge could label stops the run) or "rules" (that
        item keeps the rule labels, and its record says so).
      room: the bundled live room (`livestream.ROOMS`) whose scenarios the agent sets draw
        from (on the bundled world, its cached pool; on another world folder, that folder's
        phrasing file of the same name). Every set records it, and a set built for one room
        is refused under another.
    """

    world: livestream.World
    harness: hx.Harness
    limits: hx.Limits = dataclasses.field(default_factory=hx.Limits)
    judge: Any = None
    judge_on_failure: str = "fail"
    room: str = "v0"

    def __post_init__(self):
        livestream.room(self.room)  # an unknown room is refused, naming the known ones
        if self.judge_on_failure not in ("fail", "rules"):
            raise ValueError(
                f"EvalContext.judge_on_failure must be 'fail' or 'rules', "
                f"got {self.judge_on_failure!r}"
            )

    def describe_judge(self) -> dict[str, Any]:
        """What scored Accuracy and Effectiveness: the rules, or the panel's models and prompts
        (runs compare only under the same judge)."""
        if self.judge is None:
            return {"kind": "rules"}
        return {
            "kind": "panel",
            "judges": [f"{j.label}@{j.base_url}" for j in self.judge.judges],
            "prompts": content_hash([self.judge.system, self.judge.user_source])[:12],
        }

    @classmethod
    def default(cls, room: str = "v0") -> EvalContext:
        """The bundled world with the released Harness of `room` (Harness v0 by default).

        Raises:
          ValueError: `room` is not a bundled room (the known ones are named).
        """
        spec = livestream.room(room)
        world = livestream.load_world(spec.world_dir)
        return cls(world=world, harness=hx.load(spec.harness_dir), room=spec.name)


@dataclasses.dataclass
class Prepared:
    """What one item runs with.

    Attributes:
      state: the Harness state (agent items), or the released Harness's (single-call items).
      request: the agent loop's request (agent items).
      tools: the executors on canonical names (agent items); a fresh sandbox per `prepare`.
      messages: the conversation of a single-call item.
      scenario: the `rl.sim.Scenario` of an agent item.
      extra: anything else the kind's scorer needs (e.g. the sandbox); a scorer may leave
        `extra["details"]` (JSON data, e.g. the judges' votes) for the item's record.
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


def kind_name(set_name: str) -> str:
    """The kind a set name belongs to (`set_name`'s inverse): "t1" for "t1" and "t1-dev"."""
    return set_name.split("-", 1)[0]
