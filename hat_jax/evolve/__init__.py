"""Harness evolution (paper §2.3, appendix B.1, appendix D): the Harness is edited after
deployment with the model fixed, through diagnosis, proposals and an operator's decisions.

    from hat_jax import evolve, livestream
    evolve.init("runs/evolve", livestream.default_world_dir())           # v0 is current
    split = evolve.DevSplit(size=60)
    report = evolve.diagnose("runs/evolve", policy, split, "runs/evolve/diag")
    proposal = evolve.propose("runs/evolve", "runs/evolve/diag", evolve.RuleProposer())
    evaluation = evolve.evaluate("runs/evolve", proposal["version"], policy, split)
    evolve.decide("runs/evolve", "promote", version=proposal["version"],
                  evidence=evaluation["dir"])

Files: `versions/<hash>/` (whole Harness folders), `history.json` (every event with who and
when; decisions with their evidence), `current.json` (the last promoted version),
`proposals/<hash>/{diff.patch,proposal.json}`, `runs/<hash>/<key>/` (evaluation runs),
`evaluations/<cand>-vs-<base>/evaluation.{json,md}`. The failure report `failures.json` keeps
this contract (other tools read it):

    {"format": 1, "harness_version": str, "eval_run_dir": str,
     "clusters": [{"id": "c1", "category": str, "cause": str, "count": int, "share": float,
                   "examples": [{"run_dir": str, "set": str, "item_id": str}]}],
     "stopping_rule": str | null}

The stopping rule: when no cluster is above `max_share` of the items and the last evaluated
edit regressed a category, the report says further local rules are likely to do more harm than
good. The judge is an evolution case too (`init(..., kind="judge")` over the judge's prompt
folder): `judge_diagnose` clusters its disagreements with human labels in the same report,
`propose` (`JudgeRuleProposer` offline) and `decide` work unchanged, and `judge_evaluate`
compares agreement per dimension before/after.
CLI: `python -m launch.evolve`.
"""

from hat_jax.evolve._diagnose import cause, cluster, read_records, stopping_rule
from hat_jax.evolve._diagnose import diagnose as diagnose_run
from hat_jax.evolve._evaluate import diagnose, evaluate, run_dir_for
from hat_jax.evolve._evaluate import run as run_dev
from hat_jax.evolve._judge import (
    JudgeRuleProposer,
    ScriptedJudge,
    judge_diagnose,
    judge_evaluate,
    judge_version,
)
from hat_jax.evolve._propose import (
    Evidence,
    LLMProposer,
    ProposalInvalid,
    Proposer,
    RuleProposer,
    propose,
    submit,
    unified_diff,
)
from hat_jax.evolve._registry import (
    ACTIONS,
    RegistryError,
    checkout,
    current,
    decide,
    folder_kind,
    history,
    init,
    promoted,
    store,
    version_dir,
)
from hat_jax.evolve._runs import DevSplit, compare

__all__ = [
    "ACTIONS",
    "DevSplit",
    "Evidence",
    "LLMProposer",
    "ProposalInvalid",
    "Proposer",
    "RegistryError",
    "JudgeRuleProposer",
    "RuleProposer",
    "ScriptedJudge",
    "cause",
    "checkout",
    "cluster",
    "compare",
    "current",
    "decide",
    "diagnose",
    "diagnose_run",
    "evaluate",
    "folder_kind",
    "history",
    "init",
    "judge_diagnose",
    "judge_evaluate",
    "judge_version",
    "promoted",
    "propose",
    "read_records",
    "run_dev",
    "run_dir_for",
    "stopping_rule",
    "store",
    "submit",
    "unified_diff",
    "version_dir",
]
