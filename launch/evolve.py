"""Harness evolution with the model fixed: diagnose, propose, evaluate, decide (`hat_jax.evolve`).

  python -m launch.evolve init     --evolve_dir runs/evolve [--harness data/livestream]
  python -m launch.evolve diagnose --evolve_dir runs/evolve --policy teacher [--size 60]
  python -m launch.evolve propose  --evolve_dir runs/evolve [--proposer openai --proposer_model M]
  python -m launch.evolve propose  --evolve_dir runs/evolve --edited my/harness   # a hand edit
  python -m launch.evolve evaluate --evolve_dir runs/evolve --version <proposed hash>
  python -m launch.evolve decide   --evolve_dir runs/evolve --action promote --version <hash> \
      --evidence runs/evolve/evaluations/<hash>-vs-<current> [--checkout deploy/harness]
  python -m launch.evolve decide   --evolve_dir runs/evolve --action rollback

`diagnose` runs the policy under the current version on the dev split and writes
`failures.{json,md}` (`--eval_run` diagnoses an existing evaluation run instead); `propose`
drafts a version for the largest clusters of the last diagnosis with its diff (nothing is
promoted); `evaluate` compares a version with the current one per category; `decide` records the
operator's decision (`HAT_JAX_OPERATOR` names who, default the login).

The judge's prompts evolve the same way, against human labels of an evaluation run's items:

  python -m launch.evolve init --kind judge --evolve_dir runs/evolve-judge \
      --harness rl/rewards/prompts
  python -m launch.evolve judge-diagnose --evolve_dir runs/evolve-judge --eval_run R \
      --labels labels.jsonl [--judge_endpoints 'http://host/v1|model,...']
  python -m launch.evolve propose --evolve_dir runs/evolve-judge
  python -m launch.evolve judge-evaluate --evolve_dir runs/evolve-judge --eval_run R \
      --labels labels.jsonl --version <hash>
"""

from __future__ import annotations

import pathlib
import sys
import types

from absl import app, flags

from launch import _logs

COMMANDS = ("init", "diagnose", "propose", "evaluate", "decide", "judge-diagnose", "judge-evaluate")
FLAGS = flags.FLAGS


def _policy():
    from launch.eval import policy_for

    return policy_for(types.SimpleNamespace(
        kind=FLAGS.policy, base_url=FLAGS.base_url, model=FLAGS.model,
        api_key_env=FLAGS.api_key_env, server_extensions=False))  # fmt: skip


def _split():
    from hat_jax import evolve

    sets_dir = FLAGS.sets_dir or str(pathlib.Path(FLAGS.evolve_dir) / "sets")
    judge = None
    if FLAGS.final_judge:
        from rl.rewards import JudgePanel

        judges, transport = _judges()
        judge = JudgePanel(judges, transport=transport)
    return evolve.DevSplit(sets=tuple(FLAGS.sets), size=FLAGS.size, seed=FLAGS.seed,
                           sets_dir=sets_dir, judge=judge)  # fmt: skip


def _diagnosis_dir(version: str) -> pathlib.Path:
    return pathlib.Path(FLAGS.out or pathlib.Path(FLAGS.evolve_dir) / "diagnoses" / version)


def diagnose(evolve) -> None:
    version = FLAGS.version or evolve.current(FLAGS.evolve_dir)
    out = _diagnosis_dir(version)
    if FLAGS.eval_run:
        report = evolve.diagnose_run(FLAGS.eval_run, out, evolve_dir=FLAGS.evolve_dir,
                                     max_share=FLAGS.max_share)  # fmt: skip
    else:
        report = evolve.diagnose(FLAGS.evolve_dir, _policy(), _split(), out, version=version,
                                 max_share=FLAGS.max_share)  # fmt: skip
    for bad in report["bad_lines"]:
        print(f"skipped {bad}", file=sys.stderr)
    failed = sum(c["count"] for c in report["clusters"])
    print(f"{report['harness_version']}: {failed} failures of {report['items']} items")
    for c in report["clusters"]:
        print(f"  {c['id']} {c['category']} | {c['cause']}: {c['count']} ({c['share']:.1%})")
    print(f"stopping rule: {report['stopping_rule'] or 'not met'}")
    print(f"report: {out / 'failures.md'}")


def propose(evolve) -> None:
    failures = FLAGS.failures or _diagnosis_dir(evolve.current(FLAGS.evolve_dir))
    if FLAGS.proposer == "openai":
        proposer = evolve.LLMProposer(FLAGS.proposer_base_url, FLAGS.proposer_model,
                                      api_key_env=FLAGS.api_key_env)  # fmt: skip
    elif evolve.folder_kind(FLAGS.evolve_dir) == "judge":
        proposer = evolve.JudgeRuleProposer()
    else:
        proposer = evolve.RuleProposer()
    try:
        if FLAGS.edited:
            result = evolve.submit(FLAGS.evolve_dir, FLAGS.edited, note=FLAGS.note)
        else:
            result = evolve.propose(FLAGS.evolve_dir, failures, proposer, top=FLAGS.top)
    except evolve.ProposalInvalid as err:
        print(err, file=sys.stderr)
        sys.exit(1)
    for e in result["edits"] + result["skipped"]:
        print(f"  {e['cluster']} {e['cause']}: {e['why']}")
    if result["version"] is None:
        print("no edit proposed")
        return
    print(result["diff"], end="")
    print(f"proposed {result['version']} (parent {result['parent']}); nothing promoted")


def evaluate(evolve) -> None:
    if not FLAGS.version:
        raise app.UsageError("evaluate needs --version (the proposed version)")
    result = evolve.evaluate(FLAGS.evolve_dir, FLAGS.version, _policy(), _split(),
                             tolerance=FLAGS.tolerance)  # fmt: skip
    print((pathlib.Path(result["dir"]) / "evaluation.md").read_text(encoding="utf-8"), end="")
    print(f"evidence: {result['dir']}")


def decide(evolve) -> None:
    entry = evolve.decide(FLAGS.evolve_dir, FLAGS.action, version=FLAGS.version,
                          evidence=FLAGS.evidence, note=FLAGS.note)  # fmt: skip
    print(f"{entry['action']} {entry['version']} by {entry['who']} at {entry['at']}; "
          f"current: {evolve.current(FLAGS.evolve_dir)}")  # fmt: skip
    if FLAGS.checkout:
        print(f"checked out to {evolve.checkout(FLAGS.evolve_dir, FLAGS.checkout)}")


def _judges():
    """`--judge_endpoints`: "scripted" (the offline stand-in) or base_url|model,..."""
    from rl.rewards import JudgeEndpoint

    if FLAGS.judge_endpoints == "scripted":
        import httpx

        from hat_jax import evolve

        endpoint = JudgeEndpoint(base_url="http://scripted/v1", model="scripted")
        return [endpoint], httpx.MockTransport(evolve.ScriptedJudge())
    judges = []
    for entry in FLAGS.judge_endpoints.split(","):
        base_url, _, model = entry.strip().partition("|")
        judges.append(JudgeEndpoint(base_url=base_url, model=model,
                                    api_key_env=FLAGS.api_key_env))  # fmt: skip
    return judges, None


def _judge_inputs():
    if not (FLAGS.eval_run and FLAGS.labels):
        raise app.UsageError("judge commands need --eval_run (the judged run) and --labels")
    return (FLAGS.eval_run, FLAGS.set, FLAGS.labels, *_judges())


def judge_diagnose(evolve) -> None:
    out = _diagnosis_dir(evolve.current(FLAGS.evolve_dir))
    run, set_name, labels, judges, transport = _judge_inputs()
    report = evolve.judge_diagnose(FLAGS.evolve_dir, run, set_name, labels, out, judges,
                                   transport)  # fmt: skip
    print(f"judge {report['harness_version']}: agreement {report['agreement']}")
    for c in report["clusters"]:
        print(f"  {c['id']} {c['category']} | {c['cause']}: {c['count']}")
    print(f"report: {out / 'failures.md'}")


def judge_evaluate(evolve) -> None:
    if not FLAGS.version:
        raise app.UsageError("judge-evaluate needs --version (the proposed prompts)")
    result = evolve.judge_evaluate(FLAGS.evolve_dir, FLAGS.version, *_judge_inputs())
    print((pathlib.Path(result["dir"]) / "evaluation.md").read_text(encoding="utf-8"), end="")
    print(f"evidence: {result['dir']}")


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"usage: python -m launch.evolve {{{'|'.join(COMMANDS)}}} [flags]")
    _logs.quiet()
    from hat_jax import evolve
    from hat_jax import harness as hx

    try:
        if argv[1] == "init" or not (pathlib.Path(FLAGS.evolve_dir) / "current.json").is_file():
            version = evolve.init(FLAGS.evolve_dir, FLAGS.harness, kind=FLAGS.kind)
            print(f"{FLAGS.evolve_dir}: current version {version} from {FLAGS.harness}")
        if argv[1] != "init":
            globals()[argv[1].replace("-", "_")](evolve)
    except (evolve.RegistryError, hx.HarnessError, FileNotFoundError) as err:
        print(f"evolve {argv[1]}: {err}", file=sys.stderr)
        sys.exit(1)


def _define_flags() -> None:
    flags.DEFINE_string("evolve_dir", "runs/evolve", "The evolution folder.")
    flags.DEFINE_string("harness", "data/livestream", "init: the Harness (or world) folder.")
    flags.DEFINE_enum(
        "kind",
        "harness",
        ["harness", "judge"],
        "init: evolve the Harness, or the judge's prompts (--harness rl/rewards/prompts).",
    )
    flags.DEFINE_string(
        "labels", None, "judge-*: human labels (JSONL/CSV item_id,dimension,label)."
    )
    flags.DEFINE_string("set", "t1-dev", "judge-*: the set of --eval_run the labels are about.")
    flags.DEFINE_string(
        "judge_endpoints",
        "scripted",
        "judge-*: 'scripted' (offline stand-in) or base_url|model,...",
    )
    flags.DEFINE_bool(
        "final_judge",
        False,
        "diagnose/evaluate: --judge_endpoints label T1/T2 (their reasons in causes).",
    )
    flags.DEFINE_enum("policy", "teacher", ["teacher", "rules", "openai"], "The fixed policy.")
    flags.DEFINE_string("base_url", "http://localhost:30000/v1", "--policy openai: endpoint.")
    flags.DEFINE_string("model", "default", "--policy openai: model name.")
    flags.DEFINE_string("api_key_env", "OPENAI_API_KEY", "Environment variable of the API key.")
    flags.DEFINE_list("sets", ["t1", "t2"], "Dev sets (kinds with live-room items).")
    flags.DEFINE_integer("size", 0, "Items per dev set (0: the whole dev split).")
    flags.DEFINE_integer("seed", 0, "Dev sets' generator seed.")
    flags.DEFINE_string("sets_dir", None, "Where dev sets are stored (default <evolve_dir>/sets).")
    flags.DEFINE_string("version", None, "The version a command is about (default: current).")
    flags.DEFINE_string("out", None, "diagnose: report folder (default diagnoses/<version>).")
    flags.DEFINE_string("eval_run", None, "diagnose: an existing evaluation run to diagnose.")
    flags.DEFINE_float("max_share", 0.03, "A cluster above this share of items is systematic.")
    flags.DEFINE_string("failures", None, "propose: the diagnosis folder (default: current's).")
    flags.DEFINE_string("edited", None, "propose: an operator's edited Harness folder instead.")
    flags.DEFINE_integer("top", 3, "propose: how many of the largest clusters to address.")
    flags.DEFINE_enum("proposer", "rules", ["rules", "openai"], "propose: who drafts edits.")
    flags.DEFINE_string("proposer_base_url", "http://localhost:30000/v1", "--proposer openai.")
    flags.DEFINE_string("proposer_model", "default", "--proposer openai: model name.")
    flags.DEFINE_float("tolerance", 0.0, "evaluate: a category drop beyond this regresses.")
    flags.DEFINE_enum("action", None, ["promote", "revise", "rollback"], "decide: the decision.")
    flags.DEFINE_string("evidence", None, "decide: the evaluation folder it rests on.")
    flags.DEFINE_string("note", "", "decide: free text for the record.")
    flags.DEFINE_string("checkout", None, "decide: write the current version to this folder.")


if __name__ == "__main__":
    _define_flags()  # only as a script: absl flags are global, and launch modules share names
    app.run(main)
