"""What a dimension needs while it varies a Harness: randomness, strength, the task's needs,
the rewriter and the bank. Also `Preserve`, the task-preservation contract of `augment`."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable

from hat_jax import harness as hx
from hat_jax.hsa._bank import SKILL_NAME, TOOL_NAME, Bank
from hat_jax.hsa._rewrite import Rewriter


@dataclasses.dataclass(frozen=True, kw_only=True)
class Preserve:
    """What an augmentation must keep so that the task stays solvable (task preservation).

    A scenario states what it needs; `augment` never masks, moves or rewires anything below
    these bounds, and re-draws while `check` (an arbitrary predicate on the result) fails.

    Attributes:
      skills: canonical Skills the task loads: never masked.
      rules: rule ids (`"product-qa#5"`) the task relies on: never masked, nor is their Skill
        (critical rules are never masked anyway).
      min_rounds: the `max_rounds` constraint stays at or above this.
      min_reply_chars: `reply_max_chars` stays at or above this (the gold reply must fit).
      min_reply_sentences: `reply_max_sentences` stays at or above this.
      min_history_turns: `history_turns` stays at or above this (follow-ups need the history).
      min_comment_chars: the input hook keeps comments at least this long.
      min_comments: the input hook keeps at least this many comments.
      retry_hooks: hooks whose `retry` behaviour a recovery relies on: they keep action
        `retry` with at least one retry, and the trajectory retry budget stays positive.
      check: optional predicate on the augmented `HarnessState`; `augment` re-draws until it
        holds.
    """

    skills: frozenset[str] = frozenset()
    rules: frozenset[str] = frozenset()
    min_rounds: int = 1
    min_reply_chars: int = 0
    min_reply_sentences: int = 1
    min_history_turns: int = 0
    min_comment_chars: int = 0
    min_comments: int = 1
    retry_hooks: frozenset[str] = frozenset()
    check: Callable[[hx.HarnessState], bool] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        for name in ("skills", "rules", "retry_hooks"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"Preserve.{name} must be a collection of names, got a string")
            object.__setattr__(self, name, frozenset(value))

    def merged(self, other: Preserve) -> Preserve:
        """The union of two sets of needs (the stricter bound of each number)."""
        checks = [c for c in (self.check, other.check) if c is not None]
        return Preserve(
            skills=self.skills | other.skills,
            rules=self.rules | other.rules,
            min_rounds=max(self.min_rounds, other.min_rounds),
            min_reply_chars=max(self.min_reply_chars, other.min_reply_chars),
            min_reply_sentences=max(self.min_reply_sentences, other.min_reply_sentences),
            min_history_turns=max(self.min_history_turns, other.min_history_turns),
            min_comment_chars=max(self.min_comment_chars, other.min_comment_chars),
            min_comments=max(self.min_comments, other.min_comments),
            retry_hooks=self.retry_hooks | other.retry_hooks,
            check=(lambda s: all(c(s) for c in checks)) if checks else None,
        )


class Ctx:
    """Per-dimension state of one augmentation draw."""

    def __init__(
        self,
        *,
        rng: random.Random,
        strength: float,
        preserve: Preserve,
        rewriter: Rewriter,
        bank: Bank,
        renames: hx.RenameMap,
        reserved: Iterable[str],
        opaque_names: float,
    ):
        self.rng, self.strength, self.preserve = rng, strength, preserve
        self.opaque_names = opaque_names
        self.rewriter, self.bank, self.renames = rewriter, bank, renames
        self.reserved = frozenset(reserved)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def shuffle(self, items: list, *, must_change: bool = False) -> None:
        """Shuffles in place; with `must_change`, guarantees a different order (len > 1)."""
        if len(items) < 2:
            return
        before = list(items)
        self.rng.shuffle(items)
        if must_change and items == before:
            items.append(items.pop(0))

    def canonical_skill(self, name: str) -> str:
        return self.renames.canonical_skill(name)

    def canonical_tool(self, name: str) -> str:
        return self.renames.canonical_tool(name)

    def fresh_name(self, kind: str, canonical: str, taken: set[str]) -> str:
        """A new surface name for `canonical`: from the rewriter, else (with probability
        `opaque_names`, or when the rewriter has none left) an opaque one.

        Never a name in `taken` (names in use and already chosen), nor any canonical or
        reserved name, so a canonical name in a trajectory can never be mistaken for a renamed
        module. The chosen name is added to `taken`.
        """
        taken |= self.reserved
        pattern = SKILL_NAME if kind == "skill" else TOOL_NAME
        options = [
            n for n in self.rewriter.names(kind, canonical) if n not in taken and pattern.match(n)
        ]
        if options and not self.chance(self.opaque_names):
            name = self.rng.choice(options)
        else:
            name = f"{kind}-{self.rng.randrange(16**4):04x}"
            name = name if kind == "skill" else name.replace("-", "_")
            while name in taken:
                name = name + "x"
        taken.add(name)
        return name
