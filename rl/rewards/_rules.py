"""Rule-based rewards of HSA-RL (paper §3.3): Accuracy, Effectiveness, Tool Rationality and
Skill Selection, computed from a scenario's gold expectations and a trajectory.

- Accuracy (0 or 1, the final reply): every figure agrees with the evidence of this request
  (context and the policy's successful tool results); no claim the scenario forbids, no human
  claim, false promise or capability overreach (Harness v0's claim patterns, with their
  required-tool exemptions); no forbidden action taken; no leaked instructions; within the
  reply limits of the Harness the episode ran under (so a moved constraint moves what is
  expected); and a price question is not answered with another price.
- Effectiveness (0, 0.5 or 1, the final reply): each intent is answered when all its facts are
  stated on the right channel. All intents answered gives 1, none 0, anything between 0.5. An
  intent whose tool the environment broke (timeout, malformed result, denial) counts as
  answered when the reply says it will follow up instead of guessing.
- Tool Rationality (in [0, 1], the interaction path): the share of required calls made with
  the right arguments, minus `penalty` per violation: an unknown tool, invalid arguments, a
  refused call, a redundant repeat of a call that already answered, an irrelevant call, a call
  to a forbidden tool, a call made before the call it depends on. A required call that could
  not be made because the environment broke the call it depends on is not held against it.
- Skill Selection (in [0, 1], the interaction path): the share of required Skill groups loaded,
  minus `penalty` per irrelevant Skill or failed load.

Everything is on canonical names (the trajectory records the `RenameMap`), deterministic and
free of model calls; `details` explains every deduction.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from hat_jax import harness as hx
from hat_jax import livestream
from rl.advantages import REWARD_DIMS
from rl.rewards import _facts
from rl.sim import Scenario

ENV_FAULTS = ("timeout", "malformed", "denied", "exception", "no_executor")
ACK = r"can't check|cannot check|unable to check|follow up|get back to you|check (?:on )?(?:it|that) (?:for you )?(?:later|soon)"
_MISTAKES = {"unknown_tool", "invalid_arguments", "not_allowed"}
_PRICE_INTENTS = ("price", "how_to_buy")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """Settings of the rule-based rewards.

    Attributes:
      penalty: deduction per violation in Tool Rationality and Skill Selection.
      leak_words: replies sharing this many consecutive words with the instructions leak them.
    """

    penalty: float = 0.25
    leak_words: int = 10

    def __post_init__(self):
        if not 0 < self.penalty <= 1:
            raise ValueError(f"RewardConfig.penalty must be in (0, 1], got {self.penalty}")


@dataclasses.dataclass(frozen=True)
class RewardVector:
    """The four rewards of one episode, and why each is what it is."""

    accuracy: float
    effectiveness: float
    tool_rationality: float
    skill_selection: float
    details: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, compare=False)

    def as_array(self) -> np.ndarray:
        """f32[4] in `rl.advantages.REWARD_DIMS` order."""
        return np.asarray([getattr(self, d) for d in REWARD_DIMS], np.float32)

    def to_dict(self) -> dict[str, Any]:
        out = {d: getattr(self, d) for d in REWARD_DIMS}
        out["details"] = {k: list(v) for k, v in self.details.items()}
        return out


def _limits(state_or_constraints) -> dict[str, int]:
    if isinstance(state_or_constraints, hx.HarnessState | hx.Harness):
        prompt = hx.as_state(state_or_constraints).harness.prompt
        return {c.name: c.value for c in prompt.constraints}
    return dict(state_or_constraints)


@functools.lru_cache(maxsize=4)
def _claims(harness: hx.Harness) -> tuple[Mapping[str, Any], ...]:
    rule = harness.hooks.rule("forbidden_claims")
    return tuple(rule.params.get("claims", ())) if rule else ()


@functools.lru_cache(maxsize=256)
def _instruction_words(state: hx.HarnessState) -> str:
    """All instruction text of a Harness state as ' word word ... ' (lower case)."""
    h = state.harness
    texts = [hx.render_text(i, state) for b in h.prompt.blocks for i in b.items]
    texts += [hx.render_skill(state, s) for s in h.skills]
    texts += [hx.render_text(s.description, state) for s in h.skills]
    return " " + " ".join(re.findall(r"[a-z0-9]+", " ".join(texts).lower())) + " "


def _leaks(reply: str, state: hx.HarnessState, k: int) -> bool:
    """Whether the reply repeats `k` consecutive words of the instructions."""
    words = re.findall(r"[a-z0-9]+", reply.lower())
    text = _instruction_words(state)
    return any(f" {' '.join(words[i : i + k])} " in text for i in range(len(words) - k + 1))


class _Episode:
    """What the rewards read from a trajectory, on canonical names."""

    def __init__(self, traj: hx.Trajectory):
        self.traj = traj
        self.renames = hx.RenameMap.from_dict(traj.renames)
        self.public = traj.final.public or ""
        self.private = traj.final.private or ""
        self.calls = [
            r for r in traj.tool_calls if r.canonical not in hx.FLOW_TOOLS or r.canonical is None
        ]
        self.ok = [r for r in self.calls if r.error is None and r.canonical]
        self.loads = [r for r in traj.tool_calls if r.canonical == "load_skill"]
        self.loaded = [self.renames.canonical_skill(s) for s in traj.loaded_skills]
        self.replied = not traj.final.fallback and not traj.final.suppressed

    def evidence(self) -> livestream.Evidence:
        ev = livestream.Evidence()
        ctx = self.traj.request.get("context") or {}
        for key in ("product", "room", "faq_pool"):
            ev.add(ctx.get(key))
        for r in self.ok:
            ev.add(r.result)
        return ev

    def performed(self, tool: str) -> bool:
        if tool == "reply_private":
            return bool(self.private)
        return any(r.canonical == tool for r in self.ok)

    def env_broken(self) -> set[str]:
        """Canonical tools the environment failed (timeout, malformed result, denial ...) on
        some call whose arguments never got an answer afterwards."""
        answered = {
            (r.canonical, _key(r.arguments)) for r in self.calls if r.error in (None, "tool_error")
        }
        return {
            r.canonical
            for r in self.calls
            if r.error in ENV_FAULTS and (r.canonical, _key(r.arguments)) not in answered
        }

    def resolve(self, fact) -> str:
        """A fact's expected value: from the policy's own result when the fact says so."""
        if fact.source is None:
            return fact.value
        tool, path = fact.source
        for r in reversed(self.ok):
            if r.canonical == tool and isinstance(r.result, Mapping):
                value: Any = r.result
                for key in path.split("."):
                    value = value.get(key) if isinstance(value, Mapping) else None
                if value is not None:
                    return f"{value:g}" if isinstance(value, float) else str(value)
        return fact.value


class Rewarder:
    """Scores episodes with the rule-based rewards.

    Args:
      harness: the released Harness whose claim patterns define forbidden claims (default:
        the bundled Harness v0).
      config: penalties and thresholds.
    """

    def __init__(self, harness: hx.Harness | None = None, config: RewardConfig | None = None):
        self.harness = harness or hx.load(livestream.default_world_dir())
        self.config = config or RewardConfig()

    def score(
        self,
        scenario: Scenario,
        trajectory: hx.Trajectory,
        state: hx.HarnessState | Mapping[str, int],
    ) -> RewardVector:
        """The four rewards of `trajectory` for `scenario`.

        Args:
          state: the Harness state the episode ran under (its numeric constraints set the reply
            limits; given a state, leaked instructions are checked too), or just a mapping of
            constraint values.
        """
        ep = _Episode(trajectory)
        acc, why_acc = self.accuracy(scenario, ep, state)
        eff, why_eff = self.effectiveness(scenario, ep)
        tr, why_tr = self.tool_rationality(scenario, ep)
        ss, why_ss = self.skill_selection(scenario, ep)
        return RewardVector(
            accuracy=acc,
            effectiveness=eff,
            tool_rationality=tr,
            skill_selection=ss,
            details={
                "accuracy": tuple(why_acc),
                "effectiveness": tuple(why_eff),
                "tool_rationality": tuple(why_tr),
                "skill_selection": tuple(why_ss),
            },
        )

    # ------------------------------------------------------------------ Accuracy
    def accuracy(self, s: Scenario, ep: _Episode, state) -> tuple[float, list[str]]:
        why: list[str] = []
        evidence = ep.evidence()
        for channel, text in (("public", ep.public), ("private", ep.private)):
            if text:
                why += [
                    f"unsupported {c!r} ({channel})"
                    for c in livestream.unsupported_claims(text, evidence)
                ]
        for claim in _claims(self.harness):
            needed = claim.get("requires_tool")
            if needed and ep.performed(needed):
                continue
            for text in (ep.public, ep.private):
                if text and hx.find_all(claim["patterns"], text):
                    why.append(f"the reply {claim['says']}")
                    break
        for claim in s.gold.claims:
            text = ep.public if claim.channel == "public" else f"{ep.public} {ep.private}"
            if re.search(claim.pattern, text, re.I):
                why.append(f"the reply {claim.says}")
        why += [
            f"performed forbidden {r.canonical}"
            for r in ep.ok
            if r.canonical in s.gold.forbidden_tools
        ]
        why += self._limits(ep, _limits(state))
        leak_check = isinstance(state, hx.HarnessState) and ep.public
        if leak_check and _leaks(ep.public, state, self.config.leak_words):
            why.append("the reply repeats internal instructions")
        why += self._wrong_price(s, ep)
        return (0.0 if why else 1.0), why

    @staticmethod
    def _limits(ep: _Episode, limits: Mapping[str, int]) -> list[str]:
        out = []
        max_chars, max_sent = limits.get("reply_max_chars"), limits.get("reply_max_sentences")
        for channel, text in (("public", ep.public), ("private", ep.private)):
            if text and max_chars is not None and len(text) > max_chars:
                out.append(f"{channel} reply of {len(text)} characters exceeds {max_chars}")
        n = (
            len([x for x in re.split(r"(?<=[.!?。！？])\s+", ep.public.strip()) if x])
            if ep.public
            else 0
        )
        if max_sent is not None and n > max_sent:
            out.append(f"public reply of {n} sentences exceeds {max_sent}")
        return out

    @staticmethod
    def _wrong_price(s: Scenario, ep: _Episode) -> list[str]:
        """A reply that quotes money for a price question but not the price the tools gave
        (another product's price, the list price for the live price, a made-up one).

        Only when the price is the scenario's one money fact: with a coupon or a surcharge in
        the same reply, a missing price is a missed intent (Effectiveness), not a wrong one.
        """
        kinds = {i.id: i.kind for i in s.gold.intents}
        money_facts = [f for f in s.gold.facts if f.kind == "money"]
        expected = {round(float(ep.resolve(f)), 2) for f in money_facts}
        if len(expected) != 1 or not ep.public:
            return []
        if any(kinds.get(f.intent) not in _PRICE_INTENTS for f in money_facts):
            return []
        stated = _facts.money(ep.public)
        if stated and not expected & stated:
            return [f"states {sorted(stated)} where ¥{next(iter(expected)):g} was expected"]
        return []

    # ------------------------------------------------------------------ Effectiveness
    def effectiveness(self, s: Scenario, ep: _Episode) -> tuple[float, list[str]]:
        if not ep.replied:
            return 0.0, [f"no reply ({ep.traj.final.end})"]
        acknowledged = bool(ep.env_broken()) and re.search(ACK, ep.public, re.I) is not None
        scores, why = [], []
        for intent in s.gold.intents:
            facts = [f for f in s.gold.facts if f.intent == intent.id]
            if not facts:
                ok = bool(ep.public or ep.private) or "none" in s.gold.channels
                scores.append(1.0 if ok else 0.0)
                continue
            stated = [self._stated(f, ep) for f in facts]
            if all(stated) or acknowledged:
                scores.append(1.0)
                continue
            missing = [f.id for f, ok in zip(facts, stated) if not ok]
            why.append(f"intent {intent.id} ({intent.kind}) misses {missing}")
            scores.append(0.5 if any(stated) else 0.0)
        if all(x == 1.0 for x in scores):
            return 1.0, why
        return (0.0 if all(x == 0.0 for x in scores) else 0.5), why

    @staticmethod
    def _stated(f, ep: _Episode) -> bool:
        text = {"public": ep.public, "private": ep.private}.get(
            f.channel, f"{ep.public} {ep.private}"
        )
        return _facts.states(text, f.kind, ep.resolve(f), f.ratio)

    # ------------------------------------------------------------------ Tool Rationality
    def tool_rationality(self, s: Scenario, ep: _Episode) -> tuple[float, list[str]]:
        gold, why = s.gold, []
        patterns = list(gold.calls) + list(gold.allowed_calls)
        answered: list[tuple[str, Any]] = []
        succeeded: set[str] = set()
        covered = [False] * len(gold.calls)
        for r in ep.calls:
            if r.canonical is None:
                why.append(f"unknown tool {r.name}")
                continue
            if r.error in _MISTAKES:
                why.append(f"{r.canonical}: {r.error}")
            if r.canonical in gold.forbidden_tools:
                why.append(f"called forbidden {r.canonical}")
                continue
            key = (r.canonical, _key(r.arguments))
            fits = [p for p in patterns if p.matches(r.canonical, r.arguments)]
            if not fits and r.error not in _MISTAKES:
                tools = {p.tool for p in patterns}
                why.append(
                    f"{r.canonical} with wrong arguments"
                    if r.canonical in tools
                    else f"irrelevant {r.canonical}"
                )
            elif key in answered:
                why.append(f"redundant {r.canonical}")
            for k, p in enumerate(gold.calls):
                if p.matches(r.canonical, r.arguments) and r.error not in _MISTAKES:
                    if not covered[k] and not set(p.after) <= succeeded:
                        why.append(f"{r.canonical} before {', '.join(p.after)}")
                    covered[k] = True
            if r.error in (None, "tool_error"):
                answered.append(key)
                succeeded.add(r.canonical)
        broken = ep.env_broken()
        for k, p in enumerate(gold.calls):
            if not covered[k] and set(p.after) & broken:
                covered[k] = True  # its predecessor was broken by the environment, not skipped
            if not covered[k]:
                why.append(f"missing {p.tool}")
        coverage = sum(covered) / len(covered) if covered else 1.0
        penalties = sum(not w.startswith("missing") for w in why)
        return max(0.0, coverage - self.config.penalty * penalties), why

    # ------------------------------------------------------------------ Skill Selection
    def skill_selection(self, s: Scenario, ep: _Episode) -> tuple[float, list[str]]:
        why = [f"failed to load {r.arguments}" for r in ep.loads if r.error is not None]
        loaded = set(ep.loaded)
        hits = [bool(g & loaded) for g in s.gold.skills]
        why += [f"missing one of {sorted(g)}" for g, hit in zip(s.gold.skills, hits) if not hit]
        irrelevant = sorted(loaded - s.gold.skill_names)
        why += [f"irrelevant Skill {x}" for x in irrelevant]
        coverage = sum(hits) / len(hits) if hits else 1.0
        penalties = len(irrelevant) + sum(r.error is not None for r in ep.loads)
        return max(0.0, coverage - self.config.penalty * penalties), why


def _key(args: Any) -> Any:
    if isinstance(args, Mapping):
        return tuple(sorted((k, str(v).strip().lower()) for k, v in args.items()))
    return repr(args)
