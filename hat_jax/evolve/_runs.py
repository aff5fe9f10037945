"""Running a stored Harness version on the dev split, and comparing two versions' runs.

The dev sets are built once from the bundled world and the evolution folder's first version
(the reference), so every version runs the same items; each version is then run as the released
Harness of an `EvalContext`. Scores always come from the reference Harness's rewarder (its claim
patterns), never from the version under test: an edit of `forbidden_claims` must not move the
ruler.

`compare` pairs the two runs' items by id and reports, per category (the item's family), the
paired bootstrap of the headline score (`avg`); a category whose interval lies below zero, or
whose mean drops by more than `tolerance`, is a regression, and is flagged even when the total
improves.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax import eval as hev
from hat_jax import harness as hx
from hat_jax import hsa, livestream
from hat_jax.evolve import _registry as reg

DEV_SETS = ("t1", "t2")
METRIC = "avg"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DevSplit:
    """Which dev sets a version is run on.

    Attributes:
      sets: set kinds with agent items (T1/T2 by default).
      size: items per set; 0 (the default) is the whole dev split (342 scenarios of the bundled
        world), a smaller size a quicker, coarser loop.
      seed: the sets' generator seed.
      sets_dir: where the sets are built once and reused.
      judge: the Final Evaluation Judge (an `rl.rewards.JudgePanel`) whose labels replace the
        rule scorer's Accuracy and Effectiveness on T1/T2 (None: the rules); its reasons then
        name the causes of failures no Hook, tool or fault explains.
    """

    sets: tuple[str, ...] = DEV_SETS
    size: int = 0
    seed: int = 0
    sets_dir: str = "runs/evolve/sets"
    judge: Any = None

    def __post_init__(self):
        unknown = sorted(set(self.sets) - set(hev.KINDS))
        if not self.sets or unknown:
            raise ValueError(f"DevSplit.sets: unknown {unknown}; known {sorted(hev.KINDS)}")
        if self.size < 0:
            raise ValueError(f"DevSplit.size must be >= 0 (0: the whole split), got {self.size}")


@dataclasses.dataclass(frozen=True)
class _FixedRuler:
    """A set kind whose scores come from the reference Harness's rewarder."""

    kind: Any
    reference: hx.Harness

    def __getattr__(self, name):
        return getattr(self.kind, name)

    def prepare(self, item, ctx):
        try:
            prepared = self.kind.prepare(item, ctx)
        except (hsa.PreserveError, hsa.HsaError) as err:
            # The version lacks what the item's held-out edit must preserve (e.g. a Skill was
            # removed): the item runs under the version itself, and fails there visibly.
            plain = dataclasses.replace(item, set=f"t1-{item.set.partition('-')[2]}", harness={})
            prepared = hev.KINDS["t1"].prepare(plain, ctx)
            prepared.extra["unedited"] = f"held-out edit not applicable: {err}"
        if "rewarder" in prepared.extra:
            prepared.extra["rewarder"] = _rewarder(self.reference)
        return prepared

    def score(self, item, prepared, result):
        """The kind's scores; the rule rewards' reasons go into the record for diagnosis."""
        scores = self.kind.score(item, prepared, result)
        if "rewarder" in prepared.extra:
            reasons = self.kind.rewards(prepared, result).details
            details = prepared.extra.setdefault("details", {})
            details["reasons"] = {k: list(v) for k, v in reasons.items()}
            if "unedited" in prepared.extra:
                details["unedited"] = prepared.extra["unedited"]
        return scores


@functools.lru_cache(maxsize=4)
def _rewarder(harness: hx.Harness):
    from rl.rewards import Rewarder

    return Rewarder(harness)


def reference_context(evolve_dir: os.PathLike | str) -> hev.EvalContext:
    """The bundled world with the evolution folder's first version: what the dev sets are
    built from and scored against, whatever the bundled Harness becomes later."""
    first = next(e["version"] for e in reg.history(evolve_dir) if e["event"] == "init")
    return _reference(str(reg.version_dir(evolve_dir, first)))


@functools.lru_cache(maxsize=4)
def _reference(folder: str) -> hev.EvalContext:
    world = livestream.load_world(livestream.default_world_dir())
    return hev.EvalContext(world=world, harness=hx.load(folder))


def dev_sets(split: DevSplit, ref: hev.EvalContext) -> list[hev.EvalSet]:
    """The dev sets of `split`, built once from the reference context."""
    from rl import sim

    size = split.size or len(sim.default_scenarios().split("dev"))
    return hev.ensure_sets(list(split.sets), ref, sets_dir=split.sets_dir, split="dev",
                           sizes={k: size for k in split.sets}, seed=split.seed)  # fmt: skip


def run_version(
    evolve_dir: os.PathLike | str,
    version: str,
    policy: hev.EvalPolicy,
    *,
    split: DevSplit,
    run_dir: os.PathLike | str,
    progress: bool = False,
) -> dict[str, Any]:
    """Runs `policy` under the stored `version` on the dev sets; returns the run's summary."""
    ref = reference_context(evolve_dir)
    harness = hx.load(reg.version_dir(evolve_dir, version))
    ctx = dataclasses.replace(ref, harness=harness, judge=split.judge)
    kinds = {k: _FixedRuler(v, ref.harness) for k, v in hev.KINDS.items()}
    return hev.evaluate(dev_sets(split, ref), policy, kinds=kinds, ctx=ctx, run_dir=run_dir,
                        record={"evolve_dir": str(evolve_dir), "version": version,
                                "sets_dir": split.sets_dir}, progress=progress)  # fmt: skip


def _by_category(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in records:
        out.setdefault(r["family"], {})[f"{r['set']}/{r['id']}"] = float(r["scores"][METRIC])
    return out


def compare(
    base_run: os.PathLike | str,
    cand_run: os.PathLike | str,
    sets: Sequence[str],
    *,
    tolerance: float = 0.0,
    resamples: int = 2000,
) -> dict[str, Any]:
    """Per-category and total paired bootstrap of `cand_run` against `base_run` on `sets`.

    Returns:
      `{"total": Bootstrap dict, "categories": {family: Bootstrap dict + "regressed"},
      "regressions": [family, ...]}`.

    Raises:
      ValueError: the runs do not hold the same items (named).
    """
    base, cand = [], []
    for name in sets:
        base += hev.read_items(base_run, name)
        cand += hev.read_items(cand_run, name)
    a, b = _by_category(base), _by_category(cand)
    if {k: set(v) for k, v in a.items()} != {k: set(v) for k, v in b.items()}:
        raise ValueError(f"{base_run} and {cand_run} do not hold the same items of {list(sets)}")
    categories, regressions = {}, []
    for family in sorted(a):
        ids = sorted(a[family])
        boot = hev.paired_bootstrap([a[family][i] for i in ids], [b[family][i] for i in ids],
                                    resamples=resamples).to_dict()  # fmt: skip
        boot["regressed"] = boot["high"] < 0 or boot["delta"] < -tolerance
        categories[family] = boot
        if boot["regressed"]:
            regressions.append(family)
    every = sorted((f, i) for f in a for i in a[f])
    total = hev.paired_bootstrap([a[f][i] for f, i in every], [b[f][i] for f, i in every],
                                 resamples=resamples).to_dict()  # fmt: skip
    return {"total": total, "categories": categories, "regressions": regressions}
