"""Scenarios: viewer comment(s), room context and the gold expectations a reply is scored on.

A `Scenario` is plain, frozen, JSON-serialisable data. Gold expectations are stated on
canonical names (those of the released Harness), so one scenario serves every Harness variant:
the simulator and the rewards translate through the variant's `RenameMap`.

- `Intent`: one thing the viewer wants (a kind such as `price`, the comment it comes from, the
  product and details such as the variant asked about).
- `GoldCall`: a tool call pattern — canonical tool, arguments that must match, arguments that
  may take any value, query terms for free-text arguments, tools that must come first.
- `Fact`: information the reply must state (a money amount, a number, a clock time, a text, or
  any of a set of phrasings), optionally resolved from the tool result the policy actually got.
- `Claim`: something the reply must not say.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from hat_jax import files, hsa, livestream
from hat_jax import harness as hx

FAMILIES = (
    "product_inquiry",
    "price_promotion",
    "stock",
    "specs_size",
    "shipping",
    "after_sales",
    "purchase_payment",
    "membership_gift",
    "coupons_marketing",
    "casual_chat",
    "feedback",
    "multi_intent",
    "multi_comment",
)
SPLITS = ("train", "dev", "test")
FACT_KINDS = ("money", "number", "time", "text", "any")


def _norm_arg(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoldCall:
    """A tool call the task requires or allows, on canonical names.

    Attributes:
      tool: canonical tool name.
      args: arguments that must be present with these values (strings compared
        case-insensitively).
      free: further arguments that may be given with any value.
      terms: for a `query` argument: at least one term must occur in it (case-insensitive).
      after: canonical tools that must have succeeded earlier in the trajectory.
    """

    tool: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    free: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "args", hx.freeze(dict(self.args)))
        for name in ("free", "terms", "after"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def matches(self, tool: str | None, args: Any) -> bool:
        """Whether a call (canonical tool, arguments) fits this pattern."""
        if tool != self.tool or not isinstance(args, Mapping):
            return False
        for k, v in self.args.items():
            if _norm_arg(args.get(k)) != _norm_arg(v):
                return False
        extra = set(args) - set(self.args) - set(self.free) - ({"query"} if self.terms else set())
        if extra:
            return False
        if self.terms:
            query = str(args.get("query", "")).lower()
            return any(t.lower() in query for t in self.terms)
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "args": hx.thaw(self.args),
            "free": list(self.free),
            "terms": list(self.terms),
            "after": list(self.after),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GoldCall:
        return cls(**{k: d[k] for k in ("tool", "args", "free", "terms", "after") if k in d})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fact:
    """Information the reply must state.

    Attributes:
      id: unique within the scenario.
      intent: id of the `Intent` it answers.
      kind: money (an amount), number, time (HH:MM), text (content words of `value`, at least
        `ratio` of them), or any (a regular expression of acceptable phrasings).
      value: the expected value (for `source` facts, the value the sandbox gives the gold call).
      channel: public, private or any.
      source: (canonical tool, dotted path) to read the value from the policy's own successful
        result of that tool instead (e.g. the coupon that was actually issued).
      ratio: for text facts, the share of content words that must appear.
    """

    id: str
    intent: str
    kind: str
    value: str
    channel: str = "public"
    source: tuple[str, str] | None = None
    ratio: float = 0.6

    def __post_init__(self):
        if self.kind not in FACT_KINDS:
            raise ValueError(f"Fact {self.id}: kind {self.kind!r} not in {FACT_KINDS}")
        if self.kind == "any":
            re.compile(self.value)
        if self.source is not None:
            object.__setattr__(self, "source", tuple(self.source))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["source"] = list(self.source) if self.source else None
        return d


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    """Something the reply must not say: `pattern` (regex, case-insensitive) on `channel`."""

    id: str
    says: str
    pattern: str
    channel: str = "public"

    def __post_init__(self):
        re.compile(self.pattern)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Intent:
    """One thing a viewer wants. `detail` holds what the kind needs (variant, spec key, FAQ
    question, order number, region ...)."""

    id: str
    kind: str
    comment: int = 0
    product_id: str | None = None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "detail", hx.freeze(dict(self.detail)))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "detail": hx.thaw(self.detail)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gold:
    """What a correct trajectory does and says (canonical names).

    Attributes:
      intents: what the viewer(s) asked, in order.
      skills: required Skills as groups of acceptable alternatives (load one of each group).
      allowed_skills: further Skills that may be loaded without penalty.
      calls: required tool calls; `allowed_calls`: calls that are fine but not needed.
      forbidden_tools: canonical tools that must not be called at all.
      facts: what the reply must state; `claims`: what it must not say.
      channels: reply channels a correct answer uses ("public", "private", "none").
    """

    intents: tuple[Intent, ...]
    skills: tuple[frozenset[str], ...]
    allowed_skills: frozenset[str] = frozenset()
    calls: tuple[GoldCall, ...] = ()
    allowed_calls: tuple[GoldCall, ...] = ()
    forbidden_tools: frozenset[str] = frozenset()
    facts: tuple[Fact, ...] = ()
    claims: tuple[Claim, ...] = ()
    channels: frozenset[str] = frozenset({"public"})

    def __post_init__(self):
        object.__setattr__(self, "skills", tuple(frozenset(g) for g in self.skills))
        for name in ("allowed_skills", "forbidden_tools", "channels"):
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        for name in ("intents", "calls", "allowed_calls", "facts", "claims"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def skill_names(self) -> frozenset[str]:
        """Every Skill a correct trajectory may load."""
        return frozenset().union(*self.skills, self.allowed_skills)

    def to_dict(self) -> dict[str, Any]:
        return {
            "intents": [i.to_dict() for i in self.intents],
            "skills": [sorted(g) for g in self.skills],
            "allowed_skills": sorted(self.allowed_skills),
            "calls": [c.to_dict() for c in self.calls],
            "allowed_calls": [c.to_dict() for c in self.allowed_calls],
            "forbidden_tools": sorted(self.forbidden_tools),
            "facts": [f.to_dict() for f in self.facts],
            "claims": [dataclasses.asdict(c) for c in self.claims],
            "channels": sorted(self.channels),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Gold:
        return cls(
            intents=tuple(Intent(**i) for i in d["intents"]),
            skills=tuple(frozenset(g) for g in d["skills"]),
            allowed_skills=frozenset(d.get("allowed_skills", ())),
            calls=tuple(GoldCall.from_dict(c) for c in d.get("calls", ())),
            allowed_calls=tuple(GoldCall.from_dict(c) for c in d.get("allowed_calls", ())),
            forbidden_tools=frozenset(d.get("forbidden_tools", ())),
            facts=tuple(
                Fact(**{**f, "source": tuple(f["source"]) if f.get("source") else None})
                for f in d.get("facts", ())
            ),
            claims=tuple(Claim(**c) for c in d.get("claims", ())),
            channels=frozenset(d.get("channels", ("public",))),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scenario:
    """One simulated request with its gold expectations.

    Attributes:
      id: stable id (family, phrasing, product, viewer).
      family: one of `FAMILIES`.
      split: train, dev or test (products and phrasings are held out together).
      phrasing: id of the comment template.
      comments: the viewer comment(s); several means multi-comment mode.
      product_id: the product on screen.
      history: recent dialogue turns shown as context.
      gold: what a correct trajectory does and says.
      needs: what any Harness variant must keep for the task to stay solvable.
    """

    id: str
    family: str
    split: str
    phrasing: str
    comments: tuple[hx.Comment, ...]
    product_id: str
    gold: Gold
    history: tuple[Mapping[str, Any], ...] = ()
    needs: hsa.Preserve = dataclasses.field(default_factory=hsa.Preserve)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"scenario {self.id}: unknown family {self.family!r}")
        if self.split not in SPLITS:
            raise ValueError(f"scenario {self.id}: unknown split {self.split!r}")
        object.__setattr__(self, "comments", tuple(self.comments))
        object.__setattr__(self, "history", hx.freeze(tuple(self.history)))

    @property
    def mode(self) -> str:
        return "multi" if len(self.comments) > 1 else "single"

    def request(self, world: livestream.World) -> hx.Request:
        """The `Request` the agent loop answers, with this scenario's room context."""
        return world.make_request(
            self.comments,
            mode=self.mode,
            history=hx.thaw(self.history),
            product_id=self.product_id,
            request_id=self.id,
        )

    def to_dict(self) -> dict[str, Any]:
        n = self.needs
        return {
            "id": self.id,
            "family": self.family,
            "split": self.split,
            "phrasing": self.phrasing,
            "comments": [c.to_dict() for c in self.comments],
            "product_id": self.product_id,
            "history": hx.thaw(self.history),
            "gold": self.gold.to_dict(),
            "needs": {
                "skills": sorted(n.skills),
                "rules": sorted(n.rules),
                "retry_hooks": sorted(n.retry_hooks),
                **{
                    k: getattr(n, k)
                    for k in (
                        "min_rounds",
                        "min_reply_chars",
                        "min_reply_sentences",
                        "min_history_turns",
                        "min_comment_chars",
                        "min_comments",
                    )
                },
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Scenario:
        return cls(
            id=d["id"],
            family=d["family"],
            split=d["split"],
            phrasing=d["phrasing"],
            comments=tuple(hx.Comment(**c) for c in d["comments"]),
            product_id=d["product_id"],
            history=tuple(d.get("history", ())),
            gold=Gold.from_dict(d["gold"]),
            needs=hsa.Preserve(**d.get("needs", {})),
        )


class ScenarioSet(Sequence[Scenario]):
    """An ordered, indexable collection of scenarios with split and family views."""

    def __init__(self, scenarios: Iterable[Scenario]):
        self._items = tuple(scenarios)
        ids = [s.id for s in self._items]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise ValueError(f"duplicate scenario ids: {dup}")
        self._by_id = {s.id: s for s in self._items}

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ScenarioSet(self._items[i])
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Scenario]:
        return iter(self._items)

    def get(self, scenario_id: str) -> Scenario:
        try:
            return self._by_id[scenario_id]
        except KeyError:
            raise KeyError(f"no scenario {scenario_id!r}") from None

    def split(self, name: str) -> ScenarioSet:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; choose from {SPLITS}")
        return ScenarioSet(s for s in self._items if s.split == name)

    def family(self, name: str) -> ScenarioSet:
        if name not in FAMILIES:
            raise ValueError(f"unknown family {name!r}; choose from {FAMILIES}")
        return ScenarioSet(s for s in self._items if s.family == name)

    def counts(self) -> dict[str, dict[str, int]]:
        """Scenario counts per split and family."""
        out: dict[str, dict[str, int]] = {sp: {} for sp in SPLITS}
        for s in self._items:
            out[s.split][s.family] = out[s.split].get(s.family, 0) + 1
        return out


def write_scenarios(path: str | os.PathLike, scenarios: Iterable[Scenario]) -> pathlib.Path:
    """Writes scenarios as JSONL, atomically."""
    lines = (json.dumps(s.to_dict(), ensure_ascii=False) for s in scenarios)
    return files.write_jsonl(path, lines)


def read_scenarios(path: str | os.PathLike) -> ScenarioSet:
    """Reads a JSONL file of scenarios (errors name the line)."""
    return ScenarioSet(files.read_jsonl(path, Scenario.from_dict, what="scenario"))
