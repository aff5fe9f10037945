"""General on-policy distillation (paper §3.2/§3.4) as one library call: `run_opd`.

After HSA-SFT the student (the policy) answers general instructions with its current
weights, and is pulled back toward the frozen pre-SFT base (the teacher) by the reverse KL
KL(π_S ‖ π_T) on its own tokens. Each step:

1. `OPDSource` samples one response per prompt with `models.Sampler` holding the student's
   current weights (`Sampler.update`: the same compiled program every step); prompts longer
   than `max_prompt_len` were dropped (and counted) by the prompt pipeline, never cut;
2. the train step runs the student and the teacher over prompt + response in one program and
   minimises `opd_loss`: the exact full-vocabulary reverse KL at every position whose next
   token the student sampled (or, with `estimator="sampled"`, the score-function estimator
   on the sampled token alone), token-weighted over the batch.

Evaluations sample the held-out instructions (greedy by default) and report the exact KL to
the teacher (per token and per response), response lengths and IFEval's pass rates of the
instructions' verifiable constraints (prompt- and instruction-level, strict and loose); a few
responses are written to `<run>/samples/step_<n>.jsonl`. The figures at step 0 (the student
as it came) and at the end go to `opd_summary.{json,md}`.

It runs on `hat_jax.train`'s stage driver: the policy trained, the teacher frozen (bfloat16
if its config says so), checkpoints holding the policy at their root (so `restore_params`
and `serve.convert to-hf` read them as they read an SFT checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx

import models
from data import Instruction
from hat_jax.metrics import read_metrics
from hat_jax.sharding import MeshConfig
from hat_jax.train import (
    RANDOM,
    Init,
    ModelSpec,
    OptimizerConfig,
    StageConfig,
    StageDriver,
    TrainerConfig,
)
from rl._jax_policy import _stop_ids
from rl._opd_loss import ESTIMATORS, opd_loss, per_response
from rl._opd_sampling import HeldOutEvaluation, OPDSource, StudentSampler
from rl._summary import jsonable, write_summary

SUMMARY_FILE = "opd_summary"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OPDConfig:
    """Everything `run_opd` needs besides the models, the prompts and the tokenizer.

    Attributes:
      trainer: loop schedule; `batch_size` prompts per step (one response each), `seq_len` the
        row length (>= `max_prompt_len + max_new_tokens`).
      optimizer: AdamW and its schedule (the student's parameters).
      mesh: device mesh axis sizes.
      max_prompt_len: longest prompt (the prompt pipeline drops longer ones and counts them).
      max_new_tokens: the response-length cap.
      temperature, top_k, top_p: the student's sampling settings (temperature 1, no filter:
        the distribution whose KL is minimised).
      estimator: "exact" (full-vocabulary reverse KL per position) or "sampled" (the
        score-function estimator with per-token advantage −(log π_S − log π_T)(y_t)).
      logits_chunk: > 0 computes both models' logits this many positions at a time from
        their final hidden states (no `[B, T, V]` logits; see `hat_jax.train.sft_loss`).
      aux_loss_coef: weight of the student's MoE load-balancing loss.
      enable_thinking: render prompts with the thinking header open.
      decode_moe_dispatch: MoE dispatch of the per-token decode steps ("" keeps the model's).
      sample_chunk: prompts sampled per sampler call (0: the whole step's batch at once); a
        smaller chunk holds smaller caches beside the train state.
      num_draft_tokens: > 0 samples self-speculatively with an MTP draft head (`run_opd`'s
        `draft_head`), verifying this many drafts per step: the same distribution as plain
        sampling, fewer decode steps when the head predicts the student well. 0: plain.
      eval_temperature: sampling temperature of the held-out evaluation (0: greedy).
      eval_max_prompts: held-out prompts evaluated (0: all).
      eval_samples: responses written to `<run>/samples/` per evaluation.
    """

    trainer: TrainerConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()
    max_prompt_len: int = 128
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    estimator: str = "exact"
    logits_chunk: int = 0
    aux_loss_coef: float = 0.0
    enable_thinking: bool = False
    decode_moe_dispatch: str = ""
    sample_chunk: int = 0
    num_draft_tokens: int = 0
    eval_temperature: float = 0.0
    eval_max_prompts: int = 0
    eval_samples: int = 4

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"OPDConfig: estimator={self.estimator!r}, one of {ESTIMATORS}")
        bad = {k: getattr(self, k) for k in ("max_prompt_len", "max_new_tokens")
               if getattr(self, k) < 1}  # fmt: skip
        if bad:
            raise ValueError(f"OPDConfig: values must be >= 1: {bad}")
        for name in ("sample_chunk", "num_draft_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"OPDConfig: {name}={getattr(self, name)} must be >= 0")
        if self.max_prompt_len + self.max_new_tokens > self.trainer.seq_len:
            raise ValueError(
                f"OPDConfig: max_prompt_len {self.max_prompt_len} + max_new_tokens "
                f"{self.max_new_tokens} exceeds trainer.seq_len {self.trainer.seq_len}"
            )
        if self.temperature <= 0:
            raise ValueError(
                f"OPDConfig: temperature={self.temperature}: on-policy distillation samples "
                "the student (> 0)"
            )
        self.sampling()
        self.eval_sampling()

    def sampling(self) -> models.Sampling:
        return models.Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def eval_sampling(self) -> models.Sampling:
        if self.eval_temperature == 0:
            return models.GREEDY
        return models.Sampling(temperature=self.eval_temperature, top_p=self.top_p)

    def decode_overrides(self) -> dict[str, str] | None:
        return {"moe_dispatch": self.decode_moe_dispatch} if self.decode_moe_dispatch else None


@dataclasses.dataclass(frozen=True)
class OPDResult:
    """Where a finished OPD stage left things, and its before/after figures."""

    run_dir: pathlib.Path
    step: int
    checkpoint_dir: pathlib.Path | None
    before: dict[str, float]
    after: dict[str, float]
    train: dict[str, float]
    seconds: float
    summary_path: pathlib.Path
    resumed_from: int | None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


# -- the stage -----------------------------------------------------------------------------------


def opd_driver(
    config: OPDConfig,
    *,
    student_config: models.QwenConfig,
    teacher_config: models.QwenConfig,
    run_dir: os.PathLike | str,
    init_student: Init = RANDOM,
    init_teacher: Init = RANDOM,
    teacher_seed: int | None = None,
    run_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> StageDriver:
    """The OPD stage on the stage driver: the policy trained, the teacher frozen, the loss
    (`config.estimator`; evaluations always the exact KL); see `run_opd` for the arguments."""
    if student_config.vocab_size != teacher_config.vocab_size:
        raise ValueError(
            f"OPD: the student's vocabulary ({student_config.vocab_size}) and the teacher's "
            f"({teacher_config.vocab_size}) differ; distillation needs the same tokenizer"
        )
    tcfg = config.trainer
    seed_t = tcfg.seed if teacher_seed is None else teacher_seed
    loss = functools.partial(opd_loss, logits_chunk=config.logits_chunk,
                             aux_loss_coef=config.aux_loss_coef)  # fmt: skip
    return StageDriver(
        StageConfig(trainer=tcfg, optimizer=config.optimizer, mesh=config.mesh),
        models={
            "policy": ModelSpec(
                build=lambda: models.Qwen(student_config, rngs=nnx.Rngs(tcfg.seed)),
                init=init_student,
            ),
            "teacher": ModelSpec(
                build=lambda: models.Qwen(teacher_config, rngs=nnx.Rngs(seed_t)),
                init=init_teacher,
                frozen=True,
            ),
        },
        loss_fn=functools.partial(loss, estimator=config.estimator),
        eval_loss_fn=functools.partial(loss, estimator="exact"),
        run_dir=run_dir,
        checkpoint_root="policy",
        run_config=run_config,
        model_config=student_config.to_dict(),
        derive_metrics=per_response,
        mesh=mesh,
    )


def run_opd(
    config: OPDConfig,
    *,
    student_config: models.QwenConfig,
    teacher_config: models.QwenConfig,
    run_dir: os.PathLike | str,
    prompts,
    heldout: Sequence[Instruction],
    tokenizer,
    init_student: Init,
    init_teacher: Init,
    teacher_seed: int | None = None,
    run_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    draft_head: models.MTPHead | None = None,
) -> OPDResult:
    """Runs (or resumes) General OPD and returns its before/after figures.

    Args:
      config: the stage config.
      student_config, teacher_config: the two models' configs (same vocabulary; the
        teacher's dtypes are its own, e.g. bfloat16).
      run_dir: checkpoints, metrics, plots, samples and the summary.
      prompts: the training prompt batches for this process (`data.opd_prompt_data`), with
        `get_state` / `set_state`; never the held-out ones.
      heldout: the held-out instructions of the evaluations.
      tokenizer: the student's (and teacher's) tokenizer.
      init_student, init_teacher: `abstract params -> params` (or `hat_jax.train.RANDOM`).
      teacher_seed: the seed of a random teacher's initialisation (default the trainer's):
        a random base is exactly reproducible from it.
      run_config: JSON-serialisable config saved with every checkpoint.
      mesh: overrides the mesh built from `config.mesh`.
      draft_head: the MTP draft head of speculative sampling (`num_draft_tokens` > 0).

    Raises:
      ValueError: the two models' vocabularies differ, or speculative sampling has no head.
    """
    start = time.perf_counter()
    run_dir = pathlib.Path(run_dir)
    driver = opd_driver(config, student_config=student_config, teacher_config=teacher_config,
                        run_dir=run_dir, init_student=init_student, init_teacher=init_teacher,
                        teacher_seed=teacher_seed, run_config=run_config, mesh=mesh)  # fmt: skip
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sampler = StudentSampler(pad_id=pad, stop_tokens=_stop_ids(tokenizer),
                             decode_overrides=config.decode_overrides(),
                             chunk=config.sample_chunk, draft_head=draft_head,
                             num_draft_tokens=config.num_draft_tokens)  # fmt: skip
    source = OPDSource(prompts, sampler=sampler, config=config, seed=config.trainer.seed)
    evaluation = HeldOutEvaluation(driver, sampler, heldout, tokenizer, config, run_dir)
    resumed = driver.start(source, [evaluation])
    if resumed is None:
        driver.log_evaluation()  # step 0: the student as it came
    trained = driver.train()
    records = read_metrics(run_dir)
    evals = {r["step"]: _unprefix(r, "eval/") for r in records if "eval/kl" in r}
    train = [r for r in records if "loss" in r]
    first, last = (train[0], train[-1]) if train else ({}, {})
    result = OPDResult(
        run_dir=run_dir,
        step=trained.step,
        checkpoint_dir=trained.checkpoint_dir,
        before=evals.get(0, {}),
        after=evals.get(trained.step, {}),
        train={
            "kl_first": first.get("kl", float("nan")),
            "kl_last": last.get("kl", float("nan")),
            "steps": len(train),
        },  # fmt: skip
        seconds=time.perf_counter() - start,
        summary_path=run_dir / f"{SUMMARY_FILE}.json",
        resumed_from=resumed,
    )
    lines = summary_lines(result, config, dropped_heldout=evaluation.dropped)
    write_summary(run_dir, SUMMARY_FILE, result, config, lines)
    return result


def _unprefix(record: Mapping[str, Any], prefix: str) -> dict[str, float]:
    return {k[len(prefix) :]: v for k, v in record.items() if k.startswith(prefix)}


_ROWS = (
    ("kl", "exact reverse KL to the teacher, per token", "{:.4f}"),
    ("kl_per_response", "exact reverse KL to the teacher, per response", "{:.3f}"),
    ("pass_prompt_strict", "instruction pass rate, prompt-level strict", "{:.3f}"),
    ("pass_instruction_strict", "instruction pass rate, instruction-level strict", "{:.3f}"),
    ("pass_prompt_loose", "instruction pass rate, prompt-level loose", "{:.3f}"),
    ("pass_instruction_loose", "instruction pass rate, instruction-level loose", "{:.3f}"),
    ("response_length", "mean response length (tokens)", "{:.1f}"),
    ("stopped", "responses ended by the stop token", "{:.2f}"),
)


def summary_lines(result: OPDResult, config: OPDConfig, *, dropped_heldout: int = 0) -> list[str]:
    """The before/after table and where things are, as Markdown lines."""
    t = result.train
    lines = [
        f"General OPD: {result.step} steps in {result.seconds:.0f} s ({config.estimator} "
        f"reverse KL; {config.trainer.batch_size} prompts x up to {config.max_new_tokens} "
        f"sampled tokens per step, temperature {config.temperature}); training KL per token "
        f"{t['kl_first']:.4f} (first logged step) -> {t['kl_last']:.4f} (last).",
        "",
        f"| held-out instructions ({int(result.after.get('prompts', 0))}; "
        f"{'greedy' if not config.eval_temperature else f'T={config.eval_temperature}'}) "
        "| before | after |",
        "|---|---|---|",
    ]
    for key, label, fmt in _ROWS:
        if key in result.after:
            before = result.before.get(key, float("nan"))
            lines.append(f"| {label} | {fmt.format(before)} | {fmt.format(result.after[key])} |")
    if dropped_heldout:
        lines.append(f"\n{dropped_heldout} held-out prompts longer than max_prompt_len skipped.")
    lines += ["", f"checkpoint: {result.checkpoint_dir}",
              f"metrics: {result.run_dir / 'metrics.jsonl'}; samples: {result.run_dir / 'samples'}"]  # fmt: skip
    return lines
