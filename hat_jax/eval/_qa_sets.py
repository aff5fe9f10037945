# Over 400 lines: T1 and T2 share the sampling, the held-out edit and the scoring of one scenario split.
"""T1 Live-Stream QA and T2 Harness-Variant QA (paper §4.1-4.2, appendix E.2).

Both sets are simulator scenarios of one split of the context's live room
(`rl.sim.default_scenarios(ctx.room)`, whose splits hold products and phrasings out together;
`room_scenarios`), sampled deterministically in the seed and stratified over
families: the families are put in a seeded order, each family's scenarios are shuffled with their
own seeded stream, and items are dealt round-robin across families until `size` is reached, so
every family is represented as evenly as its scenario count allows.

- `T1` runs each scenario under the released Harness (`EvalContext.harness`), no faults.
- `T2` runs its own sample of the split, each item under a held-out Harness edit:
  `hsa.augment(released, seed=<item seed>, dims=ALL, strength=<setting>, preserve=<the
  scenario's needs>, rewriter=BankRewriter(<held-out bank>))`. The held-out bank
  (`HELDOUT_BANK_DIR`) shares no name and no reworded text with the training bank
  (`hat_jax.hsa.BANK_DIR`): T2 measures whether a policy follows names and wording it never saw
  in training. Training-time HSA must never load it; only this module does.

Each T2 item records its edit in `EvalItem.harness` (`{"edit": "heldout", "seed", "dims",
"strength", "bank", "base", "version"}`) so `prepare` rebuilds the exact state and refuses to run
when the held-out bank changed or the edit no longer reproduces the recorded Harness version.
The set's generator settings record the hashes of both banks (the bank split).

Scores are the rule-based rewards of `rl.rewards.Rewarder`, built once per released Harness:
Accuracy (0 or 1), Effectiveness (0, 0.5 or 1), their per-sample mean `avg` (before any
rounding), and the two interaction-path rewards, Tool Rationality and Skill Selection.

    ctx = EvalContext.default()
    t2 = T2.build(ctx, split="test", size=400, seed=0)
    prepared = T2.prepare(t2[0], ctx)
    traj = hx.run_agent(prepared.state, prepared.request, policy, prepared.tools, limits=ctx.limits)
    T2.score(t2[0], prepared, traj)   # {"accuracy": 1.0, "effectiveness": 1.0, "avg": 1.0, ...}
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import random
from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from hat_jax import harness as hx
from hat_jax import hsa, livestream
from hat_jax.eval._items import EvalItem, EvalSet, SetVersionError, content_hash, stable_seed
from hat_jax.eval._kind import EvalContext, Prepared, set_name
from rl import sim
from rl.rewards import JudgeUnavailable, Rewarder, RewardVector

HELDOUT_BANK_DIR = pathlib.Path(__file__).resolve().parent / "heldout_bank"
BANK_FILES = ("skills", "tools", "prompt", "hooks", "synthetic")
QA_METRICS = ("accuracy", "effectiveness", "avg", "tool_rationality", "skill_selection")
HELDOUT_EDIT = "heldout"
_SEED_ATTEMPTS = 8


# ---------------------------------------------------------------------------------- banks
def bank_hash(directory: str | pathlib.Path) -> str:
    """Content hash of a paraphrase bank folder: its parsed YAML files (comments ignored).

    Raises:
      FileNotFoundError: a bank file is missing (named).
    """
    directory = pathlib.Path(directory)
    data = {}
    for name in BANK_FILES:
        path = directory / f"{name}.yaml"
        if not path.is_file():
            raise FileNotFoundError(f"paraphrase bank {directory} has no {path.name}")
        data[name] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return content_hash(data)


@functools.cache
def heldout_bank() -> hsa.Bank:
    """The held-out bank of T2, loaded and checked once per process (`hsa.BankError` if not)."""
    return hsa.load_bank(HELDOUT_BANK_DIR)


@functools.cache
def heldout_bank_hash() -> str:
    """`bank_hash` of the held-out bank (once per process)."""
    return bank_hash(HELDOUT_BANK_DIR)


@functools.cache
def training_bank_hash() -> str:
    """`bank_hash` of the training bank that HSA-SFT and HSA-RL draw from (once per process)."""
    return bank_hash(hsa.BANK_DIR)


@functools.lru_cache(maxsize=8)
def rewarder(harness: hx.Harness) -> Rewarder:
    """One `Rewarder` per released Harness (Harnesses hash by content)."""
    return Rewarder(harness)


# ---------------------------------------------------------------------------------- scenarios
@functools.lru_cache(maxsize=4)
def _world_scenarios(root: str, phrasings: str, harness: hx.Harness) -> sim.ScenarioSet:
    return sim.generate_scenarios(livestream.load_world(root), phrasings=phrasings,
                                  harness=harness)  # fmt: skip


def room_scenarios(ctx: EvalContext) -> sim.ScenarioSet:
    """Every scenario of the context's room and world (all splits).

    On the bundled world, the room's cached pool (`rl.sim.default_scenarios(ctx.room)`); on
    another world folder, the scenarios its phrasing file of the room's name gives, solved in
    `ctx.harness` (generated once per world, file and Harness).

    Raises:
      FileNotFoundError: another world folder has no phrasing file for the room (named).
    """
    spec = livestream.room(ctx.room)
    root = pathlib.Path(ctx.world.root).resolve()
    if root == spec.world_dir.resolve():
        return sim.default_scenarios(ctx.room)
    phrasings = root / "scenarios" / spec.phrasings.name
    if not phrasings.is_file():
        raise FileNotFoundError(
            f"the world {root} has no phrasing file {phrasings.name} for the {ctx.room!r} room"
        )
    return _world_scenarios(str(root), str(phrasings), ctx.harness)


def split_scenarios(ctx: EvalContext, split: str) -> sim.ScenarioSet:
    """The scenarios of `split` for the context's room and world (`room_scenarios`).

    Raises:
      ValueError: `split` is not one of `rl.sim.SPLITS`.
    """
    if split not in sim.SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {sim.SPLITS}")
    return room_scenarios(ctx).split(split)


def stratified_sample(
    scenarios: Sequence[sim.Scenario], *, size: int, seed: int, salt: str
) -> list[sim.Scenario]:
    """`size` distinct scenarios dealt round-robin over families (see the module docstring).

    Args:
      scenarios: the pool (one split).
      size: how many to take, 1 to `len(scenarios)`.
      seed: the sample is a function of (`seed`, `salt`, the pool).
      salt: separates the samples of different set kinds.

    Raises:
      ValueError: `size` is out of range.
    """
    if not 1 <= size <= len(scenarios):
        raise ValueError(
            f"{salt}: size must be between 1 and the {len(scenarios)} scenarios of the split, "
            f"got {size}"
        )
    by_family: dict[str, list[sim.Scenario]] = {}
    for s in scenarios:
        by_family.setdefault(s.family, []).append(s)
    families = sorted(by_family)
    random.Random(stable_seed(salt, "families", seed)).shuffle(families)
    queues = []
    for family in families:
        pool = sorted(by_family[family], key=lambda s: s.id)
        random.Random(stable_seed(salt, "family", family, seed)).shuffle(pool)
        queues.append(pool)
    out: list[sim.Scenario] = []
    depth = 0
    while len(out) < size:
        for queue in queues:
            if depth < len(queue) and len(out) < size:
                out.append(queue[depth])
        depth += 1
    return out


# ---------------------------------------------------------------------------------- kinds
@dataclasses.dataclass(frozen=True)
class _ScenarioQA:
    """What T1 and T2 share: scenario items, a fresh fault-free sandbox, rule-based scores."""

    name: str
    metrics: tuple[str, ...] = QA_METRICS

    def _items(
        self, ctx: EvalContext, *, split: str, size: int, seed: int
    ) -> tuple[str, list[sim.Scenario]]:
        scenarios = split_scenarios(ctx, split)
        if not 1 <= size <= len(scenarios):
            raise ValueError(
                f"{self.name}: size must be between 1 and the {len(scenarios)} {split} "
                f"scenarios, got {size}"
            )
        chosen = stratified_sample(scenarios, size=size, seed=seed, salt=self.name)
        return set_name(self.name, split), chosen

    def _check_item(self, item: EvalItem) -> sim.Scenario:
        if item.scenario is None:
            raise ValueError(f"{self.name}: item {item.id} has no scenario")
        if item.set.split("-", 1)[0] != self.name:
            raise ValueError(f"{self.name}: item {item.id} belongs to set {item.set!r}")
        return sim.Scenario.from_dict(item.scenario)

    def _prepared(
        self, scenario: sim.Scenario, state: hx.HarnessState, ctx: EvalContext
    ) -> Prepared:
        sandbox = sim.Sandbox(ctx.world)
        return Prepared(
            state=state,
            request=scenario.request(ctx.world),
            tools=sandbox.tools,
            scenario=scenario,
            extra={"sandbox": sandbox, "rewarder": rewarder(ctx.harness), "judge": ctx.judge,
                   "judge_on_failure": ctx.judge_on_failure},
        )  # fmt: skip

    def rewards(self, prepared: Prepared, trajectory: hx.Trajectory) -> RewardVector:
        """The full reward vector, with the reason for every deduction (`details`)."""
        if not isinstance(trajectory, hx.Trajectory):
            raise TypeError(
                f"{self.name} scores agent trajectories, got {type(trajectory).__name__}"
            )
        rewarder = prepared.extra.get("rewarder")
        if not isinstance(rewarder, Rewarder):
            raise ValueError(f"{self.name}: score a Prepared that {self.name}.prepare made")
        return rewarder.score(prepared.scenario, trajectory, prepared.state)

    def score(self, item: EvalItem, prepared: Prepared, result: Any) -> dict[str, float]:
        """Accuracy, Effectiveness, their per-sample mean `avg`, Tool Rationality and Skill
        Selection of one trajectory, each in [0, 1]."""
        r = self.rewards(prepared, result)
        acc, eff = float(r.accuracy), float(r.effectiveness)
        details: dict[str, Any] = {"rules": {"accuracy": acc, "effectiveness": eff}}
        judge = prepared.extra.get("judge")
        if judge is not None:
            verdict = judge.judge(prepared.scenario, result)
            details["judge"] = {
                "accuracy": verdict.accuracy,
                "effectiveness": verdict.effectiveness,
                "votes": [dataclasses.asdict(v) for v in verdict.votes],
            }
            if verdict.accuracy is None or verdict.effectiveness is None:
                why = "; ".join(f"{v.judge}: {v.error}" for v in verdict.votes)
                if prepared.extra.get("judge_on_failure", "fail") == "fail":
                    raise JudgeUnavailable(
                        f"{item.set}: no valid judge vote on item {item.id} ({why}); fix the "
                        "judge endpoints or set judge.on_failure to 'rules'"
                    )
                details["judge"]["fallback"] = "rules"
            else:
                acc, eff = float(verdict.accuracy), float(verdict.effectiveness)
        prepared.extra["details"] = details
        return {
            "accuracy": acc,
            "effectiveness": eff,
            "avg": (acc + eff) / 2,
            "tool_rationality": float(r.tool_rationality),
            "skill_selection": float(r.skill_selection),
        }


@dataclasses.dataclass(frozen=True)
class LiveStreamQA(_ScenarioQA):
    """T1: scenarios of one split under the released Harness, no faults."""

    name: str = "t1"

    def build(self, ctx: EvalContext, *, split: str, size: int, seed: int) -> EvalSet:
        """`size` stratified scenarios of `split` (see the module docstring)."""
        name, chosen = self._items(ctx, split=split, size=size, seed=seed)
        items = tuple(
            EvalItem(id=s.id, set=name, family=s.family, scenario=s.to_dict()) for s in chosen
        )
        generator = {"kind": self.name, "split": split, "size": size, "seed": seed}
        return EvalSet(name, items, generator, room=ctx.room)

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared:
        """The released Harness, the scenario's request, a fresh fault-free sandbox."""
        scenario = self._check_item(item)
        if item.harness:
            raise ValueError(f"{self.name}: item {item.id} carries a Harness edit {item.harness}")
        return self._prepared(scenario, hx.HarnessState(harness=ctx.harness), ctx)


@dataclasses.dataclass(frozen=True)
class HarnessVariantQA(_ScenarioQA):
    """T2: scenarios of one split, each under a held-out Harness edit.

    Attributes:
      strength: HSA strength of the edits (the probability of each individual change).
      dims: HSA dimensions edited (all five by default).
    """

    name: str = "t2"
    strength: float = 0.5
    dims: frozenset[hsa.Dim] = hsa.ALL

    def __post_init__(self):
        object.__setattr__(self, "dims", hsa.parse_dims(self.dims))
        if not self.dims or not 0.0 < self.strength <= 1.0:
            raise ValueError(
                f"{self.name}: needs at least one dimension and a strength in (0, 1], "
                f"got {sorted(self.dims)} and {self.strength}"
            )

    def build(self, ctx: EvalContext, *, split: str, size: int, seed: int) -> EvalSet:
        """`size` stratified scenarios of `split`, each with its own held-out edit.

        Raises:
          ValueError: bad split or size.
          hsa.HsaError: no edit of a scenario met its needs within a few seeds (named).
        """
        name, chosen = self._items(ctx, split=split, size=size, seed=seed)
        bank = heldout_bank_hash()
        dims = sorted(d.value for d in self.dims)
        items = []
        for s in chosen:
            edit_seed, state = self._edit(ctx.harness, s, seed)
            edit = {
                "edit": HELDOUT_EDIT,
                "seed": edit_seed,
                "dims": dims,
                "strength": self.strength,
                "bank": bank,
                "base": ctx.harness.version,
                "version": state.harness.version,
            }
            items.append(
                EvalItem(id=s.id, set=name, family=s.family, scenario=s.to_dict(), harness=edit)
            )
        generator = {
            "kind": self.name,
            "split": split,
            "size": size,
            "seed": seed,
            "strength": self.strength,
            "dims": dims,
            "banks": {"train": training_bank_hash(), "heldout": bank},
        }
        return EvalSet(name, tuple(items), generator, room=ctx.room)

    def _edit(
        self, harness: hx.Harness, scenario: sim.Scenario, seed: int
    ) -> tuple[int, hx.HarnessState]:
        """The first seed (of a few derived from `seed` and the scenario) whose edit keeps the
        task solvable, and the edited state."""
        failures = []
        for attempt in range(_SEED_ATTEMPTS):
            edit_seed = stable_seed(self.name, "edit", seed, scenario.id, attempt)
            try:
                return edit_seed, _heldout_state(
                    harness, scenario, edit_seed, self.dims, self.strength
                )
            except (hsa.PreserveError, hsa.HsaError) as err:
                failures.append(f"seed {edit_seed}: {err}")
        raise hsa.HsaError(
            f"{self.name}: no held-out edit of {scenario.id} meets its needs:\n  "
            + "\n  ".join(failures)
        )

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared:
        """Rebuilds the item's held-out Harness state from its recorded edit.

        The edit is applied to `ctx.harness`. When that is the Harness the set was built from
        (`base`), the result must be the recorded Harness version; under another released
        Harness (an operator's edit, as in the paper's Harness-edit test) the same edit is
        applied to it and there is no recorded version to compare with.

        Raises:
          SetVersionError: the held-out bank changed since the set was built, or the edit no
            longer reproduces the recorded Harness version (HSA code changed): rebuild the set.
        """
        scenario = self._check_item(item)
        edit = item.harness
        if edit.get("edit") != HELDOUT_EDIT:
            raise ValueError(f"{self.name}: item {item.id} has no held-out edit: {edit}")
        if edit["bank"] != heldout_bank_hash():
            raise SetVersionError(
                f"{self.name}: item {item.id} was built with held-out bank {edit['bank'][:12]}, "
                f"but {HELDOUT_BANK_DIR} is now {heldout_bank_hash()[:12]}; rebuild the set"
            )
        state = _heldout_state(
            ctx.harness, scenario, int(edit["seed"]), edit["dims"], float(edit["strength"])
        )
        if ctx.harness.version == edit["base"] and state.harness.version != edit["version"]:
            raise SetVersionError(
                f"{self.name}: item {item.id} rebuilds Harness {state.harness.version}, not the "
                f"recorded {edit['version']} (augmentation code changed); rebuild the set"
            )
        return self._prepared(scenario, state, ctx)


def _heldout_state(
    harness: hx.Harness,
    scenario: sim.Scenario,
    seed: int,
    dims: Iterable[str | hsa.Dim],
    strength: float,
) -> hx.HarnessState:
    """The held-out edit of `harness` for `scenario`: what it needs is preserved exactly as the
    live room preserves it for a fault-free episode."""
    return hsa.augment(
        harness,
        seed=seed,
        dims=dims,
        strength=strength,
        preserve=sim.injection_needs(scenario, None),
        rewriter=hsa.BankRewriter(heldout_bank()),
    )


def run_teacher(
    kind: LiveStreamQA | HarnessVariantQA, item: EvalItem, ctx: EvalContext
) -> dict[str, float]:
    """Runs the scripted teacher on one T1/T2 item and scores it (a solvability check)."""
    prepared = kind.prepare(item, ctx)
    teacher = sim.ScriptedTeacher(prepared.scenario, prepared.state, ctx.world)
    traj = hx.run_agent(
        prepared.state, prepared.request, teacher, prepared.tools, limits=ctx.limits
    )
    return kind.score(item, prepared, traj)


T1 = LiveStreamQA()
T2 = HarnessVariantQA()
