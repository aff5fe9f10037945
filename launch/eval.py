"""Evaluate a policy on the paper's sets: T1, T2, T3 (tool and prompt robustness), the general
set and, when its extra is installed, IFEval; write per-item results, a summary and a report.

  python -m launch.eval --config=configs/eval_demo.py                  # the demo's SFT policy
  python -m launch.eval --config=configs/eval_demo.py:teacher          # the scripted teacher
  python -m launch.eval --config=configs/eval_demo.py:hf \
      --config.baseline=runs/eval/teacher                              # paired comparison
  python -m launch.eval --config=configs/eval_demo.py:openai \
      --config.policy.base_url=http://localhost:30000/v1               # an endpoint

`config.policy.kind`: "jax" (`config.policy.checkpoint`: an Orbax checkpoint or an HF
directory), "teacher" (the scripted teacher, the ceiling), "rules" (the offline rule policy) or
"openai" (any OpenAI-compatible endpoint). `config.judge.endpoints` makes a panel of LLM judges
the Final Evaluation Judge of T1/T2's Accuracy and Effectiveness (the rule scorers otherwise);
`config.calibration.labels` (JSONL/CSV of item_id, dimension, label) writes the calibration of
the rule scorer, the panel and each judge against those human labels. `config.harness_edit`
(an edit file, `hat_jax.harness.load_edit`) runs the same items under the released Harness with
that revision of its prompt and Skills applied (the weights fixed), as Harness evolution does.
`config.room` ("v0" or "micro", `hat_jax.livestream.ROOMS`) is the live room: its released
Harness and its scenarios; summary.json and report.md record it. Sets are built once under
`config.sets_dir` and reused (`hat_jax.eval.ensure_sets`; a folder of one room's sets is
refused for another: one `sets_dir` per room); a rerun with the same `run_dir` resumes, only
under the same checkpoint. Writes `<run_dir>/items/<set>.jsonl`, `summary.json`, `report.md` and
`plots/`. The summary's `run.policy` records the `checkpoint_digest` (`serve.digest`) of what
ran: a jax policy's checkpoint, or the checkpoint an openai endpoint reports serving; the
release gates (`launch.release`) compare it with the candidate's.

  python -m launch.eval --config=configs/eval_demo.py:teacher --config.room=micro \
      --config.sets_dir=runs/eval/sets-micro --config.run_dir=runs/eval/teacher-micro
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from absl import app

from hat_jax import eval as hev
from hat_jax import harness as hx
from hat_jax import livestream
from launch import _common

_FLAGS: dict = {}
POLICIES = ("jax", "teacher", "rules", "openai")


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's values."""

    sets: tuple[str, ...]
    split: str
    sizes: dict[str, int]
    versions: dict[str, str]
    seed: int
    sets_dir: pathlib.Path
    run_dir: pathlib.Path
    config: hev.RunConfig
    limits: hx.Limits
    baseline: str | None
    harness_edit: hx.HarnessEdit | None = None
    room: str = "v0"


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` (set names, policy kind, live room, sampling) and converts it."""
    room = livestream.room(c.get("room", "v0")).name  # an unknown room is refused by name
    names = tuple(s.strip() for s in c.sets.split(",") if s.strip())
    unknown = sorted(set(names) - set(hev.KINDS))
    if not names or unknown:
        raise ValueError(f"config.sets={c.sets!r}: unknown {unknown}; known {sorted(hev.KINDS)}")
    if c.policy.kind not in POLICIES:
        raise ValueError(f"config.policy.kind={c.policy.kind!r}: choose one of {POLICIES}")
    s = c.sampling
    return Built(
        sets=names,
        split=c.split,
        sizes={k: int(v) for k, v in c.sizes.to_dict().items() if v},
        versions={k: v for k, v in c.versions.to_dict().items() if v},
        seed=c.seed,
        sets_dir=pathlib.Path(c.sets_dir),
        run_dir=pathlib.Path(run_dir or c.run_dir),
        config=hev.RunConfig(
            sampling=hx.SamplingParams(
                temperature=s.temperature,
                top_p=s.top_p,
                max_tokens=s.max_tokens,
                enable_thinking=s.enable_thinking,
            ),  # fmt: skip
            batch_size=c.batch_size,
            concurrency=c.concurrency,
            seed=c.seed,
            keep_trajectories=c.keep_trajectories,
        ),
        limits=hx.Limits(**c.limits.to_dict()),
        baseline=c.baseline or None,
        harness_edit=hx.load_edit(c.harness_edit) if c.harness_edit else None,
        room=room,
    )


def policy_for(p) -> hev.EvalPolicy:
    """The evaluation policy of a config's `policy` block."""
    if p.kind == "teacher":
        from rl import sim

        return hev.FactoryPolicy(
            lambda prepared, ctx: sim.ScriptedTeacher(
                prepared.scenario, prepared.state, ctx.world
            ),  # fmt: skip
            describe={"kind": "teacher"},
            agent_only=True,
        )
    if p.kind == "rules":
        return hev.FactoryPolicy(
            lambda prepared, ctx: livestream.RuleBasedPolicy(prepared.state, ctx.world),
            describe={"kind": "rules"},
            agent_only=True,
        )
    if p.kind == "openai":
        policy = hx.OpenAICompatPolicy(
            base_url=p.base_url,
            model=p.model,
            api_key=os.environ.get(p.api_key_env),
            server_extensions=p.server_extensions,
        )
        describe = {"kind": "openai", "endpoint": p.base_url, "model": p.model,
                    **endpoint_digests(p.base_url, p.model, os.environ.get(p.api_key_env))}  # fmt: skip
        return hev.EndpointPolicy(policy, describe=describe)
    from serve import load_jax_policy

    if not p.checkpoint:
        raise ValueError("config.policy.checkpoint is required for policy.kind='jax'")
    policy, describe = load_jax_policy(
        p.checkpoint, tokenizer_dir=p.tokenizer_dir or None, dtype=p.dtype,
        max_length=p.max_length,
    )  # fmt: skip
    return hev.BatchedPolicy(policy, describe=describe, engine=p.get("engine", "lockstep"))


def endpoint_digests(base_url: str, model: str, api_key: str | None) -> dict[str, Any]:
    """The checkpoint an endpoint reports serving (`serve.replay.served_digests`: our server's
    digests, SGLang's model_path hashed here); empty when it reports none or does not answer
    (the evaluation then says so itself)."""
    import httpx

    from serve import replay

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=base_url.rstrip("/"), timeout=10, headers=headers) as client:
            served = replay.served_digests(client, model, replay.server_info(client, base_url))
    except (httpx.HTTPError, OSError, ValueError):
        return {}
    return served if served["checkpoint_digest"] else {}


def check_resume(run_dir: pathlib.Path, describe: dict[str, Any]) -> None:
    """A run directory resumes only under the checkpoint that wrote it: the results it keeps
    and those added must be of one checkpoint (`checkpoint_digest`, `serve.digest`)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return
    before = hev.read_summary(run_dir).get("run", {}).get("policy", {})
    old, new = before.get("checkpoint_digest"), describe.get("checkpoint_digest")
    if old != new:
        raise ValueError(
            f"{run_dir} holds results of checkpoint {old or 'with no digest recorded'} "
            f"({before.get('checkpoint') or before.get('kind')}), not of {new or 'no digest'} "
            f"({describe.get('checkpoint') or describe.get('kind')}): use a new run directory"
        )


def judge_for(j):
    """The Final Evaluation Judge of a config's `judge` block (None: the rule scorers)."""
    if not j.endpoints:
        return None
    from rl import rewards

    judges = []
    for entry in j.endpoints.split(","):
        base_url, _, model = entry.strip().partition("|")
        if not base_url or not model:
            raise ValueError(f"config.judge.endpoints: {entry!r} is not 'base_url|model'")
        judges.append(rewards.JudgeEndpoint(base_url=base_url, model=model,
                                            api_key_env=j.api_key_env or None))  # fmt: skip
    return rewards.JudgePanel(judges, prompt_dir=j.prompts or None, cache_dir=j.cache_dir or None)


def calibrate(c, run_dir: pathlib.Path) -> pathlib.Path:
    """`<run_dir>/calibration.md` (and `.json`): the judges (rules, panel, each judge) against
    the human labels of `config.calibration.labels` on `config.calibration.set`."""
    from hat_jax import files
    from hat_jax.eval import _calibration as cal

    human = cal.read_labels(c.calibration.labels)
    report = cal.calibration_report(human, cal.run_predictions(run_dir, c.calibration.set))
    files.write_json(run_dir / "calibration.json", report)
    return cal.write_calibration(run_dir / "calibration.md", report)


def run(c, *, run_dir: str | None = None) -> dict[str, Any]:
    """Builds the sets, evaluates the policy, writes the report (and the judge calibration
    when human labels are given); returns the summary."""
    b = build(c, run_dir=run_dir)
    ctx = dataclasses.replace(hev.EvalContext.default(b.room), limits=b.limits,
                              judge=judge_for(c.judge),
                              judge_on_failure=c.judge.on_failure)  # fmt: skip
    sets = hev.ensure_sets(b.sets, ctx, sets_dir=b.sets_dir, split=b.split, sizes=b.sizes,
                           seed=b.seed, versions=b.versions)  # fmt: skip
    record: dict[str, Any] = {"sets_dir": str(b.sets_dir)}
    if b.harness_edit is not None:  # the same items, under the edited Harness
        ctx = dataclasses.replace(ctx, harness=hx.apply_edit(ctx.harness, b.harness_edit))
        record["harness_edit"] = b.harness_edit.describe()
    policy = policy_for(c.policy)
    check_resume(b.run_dir, policy.description)
    summary = hev.evaluate(sets, policy, kinds=hev.KINDS, ctx=ctx,
                           run_dir=b.run_dir, config=b.config, record=record)  # fmt: skip
    hev.write_report(b.run_dir, baseline_dir=b.baseline)
    if c.calibration.labels:
        calibrate(c, b.run_dir)
    return summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    run = summary["run"]
    lines = [f"policy {run['policy']} in the {run.get('room', 'v0')} room ({run['harness']})"]
    for name, s in summary["sets"].items():
        figures = " ".join(f"{m}={100 * v:.1f}" for m, v in s["metrics"].items())
        lines.append(f"{name} ({s['version']}, n={s['n']}): {figures}")
    return lines


def main(argv):
    del argv
    _common.run_main("eval", run, summary_lines, _FLAGS)


if __name__ == "__main__":
    _FLAGS.update(_common.define_flags("configs/eval_demo.py"))
    app.run(main)
