"""Evaluation (paper §4, appendix E): versioned sets, any policy, scores, statistics, reports.

    from hat_jax import eval as hev
    ctx = hev.EvalContext.default()                               # bundled world + Harness v0
    # hev.EvalContext.default("micro"): the micro room's Harness and scenarios (own sets_dir)
    sets = hev.ensure_sets(["t1", "t2", "general"], ctx, sets_dir="runs/eval/sets")
    policy = hev.BatchedPolicy(jax_policy, describe={"kind": "jax"})   # or Factory/Endpoint
    hev.evaluate(sets, policy, kinds=hev.KINDS, ctx=ctx, run_dir="runs/eval/sft")
    hev.write_report("runs/eval/sft", baseline_dir="runs/eval/base")  # tables, intervals, plots

Sets (`KINDS`): `t1` Live-Stream QA (held-out scenarios, original Harness), `t2`
Harness-Variant QA (held-out Harness edits from `HELDOUT_BANK_DIR`, a bank training-time HSA
never uses), `t3_tool` / `t3_prompt` (distractor tools; active instruction constraints),
`general` (programmatic verifiable instructions, disjoint from OPD's prompts) and `ifeval` (the
541 official prompts, the official scorer, offline; the `eval` extra and
`python -m hat_jax.eval.setup_ifeval`). Statistics: `paired_bootstrap`, `compare_runs`
(refuses different set versions), `mean_interval`; judge calibration against human labels:
`read_labels`, `calibration_report`. The Harness-edit test's automatic check: `host_wording`
(is a reply the policy's own, worded as a live host speaks). Teacher-forced tool choice on
gold conversations, where a policy that fails the sets is stuck: `tool_choice`
(`python -m launch.tool_choice`); in-context copying (the induction score: random tokens shown
twice), which the agent task needs before any decision can be learned: `copy_score`;
teacher-forced answers of records such as the base corpus's lookup items: `answer_score`; the
names written under renamed tools and Skills (the listed name copied, or the training name
memorised), counted per item and shown per set in the report: `name_counts`, `copy_share`. CLI:
`python -m launch.eval`.
"""

from hat_jax.eval._answers import answer_evaluation, answer_score
from hat_jax.eval._calibration import calibration_report, read_labels, write_calibration
from hat_jax.eval._copying import copy_evaluation, copy_rows, copy_score, ordinary_token_ids
from hat_jax.eval._decisions import (
    format_tool_choice,
    model_greedy_fn,
    tool_choice,
    tool_choice_evaluation,
)
from hat_jax.eval._ifeval import (
    IFEvalSetupError,
    ifeval_prompt_hashes,
    ifeval_prompts,
    require_ifeval,
    score_ifeval,
)
from hat_jax.eval._items import EvalItem, EvalSet, SetVersionError, read_set, write_set
from hat_jax.eval._kind import EvalContext, Prepared, SetKind
from hat_jax.eval._names import copy_share, name_counts
from hat_jax.eval._qa_sets import HELDOUT_BANK_DIR
from hat_jax.eval._report import write_report
from hat_jax.eval._run import (
    BatchedPolicy,
    EndpointPolicy,
    EvalError,
    EvalPolicy,
    FactoryPolicy,
    RunConfig,
    evaluate,
    read_items,
    read_summary,
)
from hat_jax.eval._sets import DEFAULT_SIZES, KINDS, ensure_set, ensure_sets
from hat_jax.eval._stats import Bootstrap, compare_runs, mean_interval, paired_bootstrap
from hat_jax.eval._wording import CATEGORIES as WORDING_PROBLEMS
from hat_jax.eval._wording import host_wording

__all__ = [
    "DEFAULT_SIZES",
    "HELDOUT_BANK_DIR",
    "KINDS",
    "WORDING_PROBLEMS",
    "BatchedPolicy",
    "Bootstrap",
    "EndpointPolicy",
    "EvalContext",
    "EvalError",
    "EvalItem",
    "EvalPolicy",
    "EvalSet",
    "FactoryPolicy",
    "IFEvalSetupError",
    "Prepared",
    "RunConfig",
    "SetKind",
    "SetVersionError",
    "answer_evaluation",
    "answer_score",
    "calibration_report",
    "compare_runs",
    "copy_evaluation",
    "copy_rows",
    "copy_score",
    "copy_share",
    "ensure_set",
    "ensure_sets",
    "evaluate",
    "format_tool_choice",
    "host_wording",
    "model_greedy_fn",
    "tool_choice",
    "tool_choice_evaluation",
    "ifeval_prompt_hashes",
    "ifeval_prompts",
    "mean_interval",
    "name_counts",
    "ordinary_token_ids",
    "paired_bootstrap",
    "read_items",
    "read_labels",
    "read_set",
    "read_summary",
    "require_ifeval",
    "score_ifeval",
    "write_calibration",
    "write_report",
    "write_set",
]
