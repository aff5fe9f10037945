"""MTP draft-head adaptation as one library call: `run_mtp`.

The policy is frozen; a draft head grafted onto it (from a base checkpoint, a previous run, or
a random initialisation when asked for) is trained with the multi-token cross-entropy
(`rl.mtp.mtp_loss`: the head at position t predicts token t + 2) on rollouts of the policy
itself (`rl.mtp._rollouts`). Held-out rollouts give the before/after figures: the loss, the
per-token acceptance α = Σ_v min(p, q) of speculative sampling and the simulated acceptance
length with k drafts (`rl.mtp.acceptance_probability` / `acceptance_length`), at the
rollout temperature and greedily.

It runs on `hat_jax.train`'s stage driver: two models, the policy frozen (read from its
source on every start, never differentiated or checkpointed) and the head trained (AdamW
state for the head alone); this stage's loss; a pool of rollouts as the batch source; the
held-out loss and acceptance figures as the evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import pathlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import models
from hat_jax import files
from hat_jax.checkpoint import save_params
from hat_jax.sharding import MeshConfig
from hat_jax.train import (
    RANDOM,
    Init,
    LossOutput,
    Models,
    ModelSpec,
    OptimizerConfig,
    StageConfig,
    StageDriver,
    TrainerConfig,
)
from rl import _summary
from rl._summary import jsonable
from rl.mtp import _rollouts as ro
from rl.mtp._loss import acceptance_length, acceptance_probability, mtp_loss, mtp_targets

_log = logging.getLogger(__name__)

SUMMARY_FILE = "mtp_summary"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MTPConfig:
    """Everything `run_mtp` needs besides the policy, the head's start and the prompts.

    Attributes:
      trainer: loop schedule; `batch_size` rollout rows per step, `seq_len` the row length
        (prompt + `rollout.max_new_tokens` must fit), `eval_every` / `eval_batches` for the
        held-out metrics during training.
      optimizer: AdamW and its schedule (for the head's parameters only).
      mesh: device mesh axis sizes.
      rollout: how the frozen policy is sampled.
      num_draft_tokens: k of the simulated acceptance length (drafts per verification).
      aux_loss_coef: weight of the head's MoE load-balancing loss.
      measure_speculative: also run real self-speculative decoding (`models.Sampler` with the
        head) on the held-out prompts before and after, and report its acceptance length.
    """

    trainer: TrainerConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()
    rollout: ro.RolloutConfig = ro.RolloutConfig()
    num_draft_tokens: int = 3
    aux_loss_coef: float = 0.0
    measure_speculative: bool = False

    def __post_init__(self):
        if self.num_draft_tokens < 1:
            raise ValueError(f"MTPConfig: num_draft_tokens={self.num_draft_tokens} must be >= 1")


@dataclasses.dataclass(frozen=True)
class MTPResult:
    """Where a finished MTP stage left things, and its before/after figures."""

    run_dir: pathlib.Path
    step: int
    head_dir: pathlib.Path
    before: dict[str, float]
    after: dict[str, float]
    rollouts: dict[str, int]
    seconds: float
    summary_path: pathlib.Path
    resumed_from: int | None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


class Drafter(Models):
    """The frozen policy and its draft head, compiled together by the stage's step."""

    def __init__(self, policy: models.Qwen, head: models.MTPHead):
        super().__init__(policy=policy, head=head)


def mtp_stage_loss(
    model: Drafter,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    aux_loss_coef: float = 0.0,
    temperature: float = 1.0,
    num_draft_tokens: int = 0,
) -> LossOutput:
    """The head's cross-entropy on token t + 2 as sums (`hat_jax.train.LossOutput`).

    `batch` has `input_ids`, `loss_mask` (1 on policy-sampled tokens), `segment_ids` and
    `positions`. With `num_draft_tokens` > 0 the metrics also carry the acceptance figures
    (sums over counted positions): `acceptance` (α at `temperature`), `acceptance_length`
    and, greedily, `greedy_acceptance` / `greedy_acceptance_length`.
    """
    del rng
    ids, segs, pos = batch["input_ids"], batch["segment_ids"], batch["positions"]
    out = model.policy(ids, positions=pos, segment_ids=segs)
    hidden = jax.lax.stop_gradient(out.hidden)
    next_ids = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
    draft = model.head(hidden, next_ids, model.policy, positions=pos, segment_ids=segs)
    targets, mask = mtp_targets(ids, batch["loss_mask"], offset=2, segment_ids=segs)
    loss, m = mtp_loss(draft.logits, targets, mask)
    tokens = m["mtp_tokens"]
    metrics = {"mtp_top1": m["mtp_top1"] * tokens, "mtp_aux_loss": draft.aux_loss * tokens}
    if num_draft_tokens:
        metrics |= _acceptance_sums(draft.logits, out.logits, mask, temperature, num_draft_tokens)
    total = (loss + aux_loss_coef * draft.aux_loss) * tokens
    return LossOutput(total=total, weight=tokens, metrics=metrics)


def _acceptance_sums(draft_logits, policy_logits, mask, temperature, k) -> dict[str, jax.Array]:
    """Acceptance figures summed over counted positions: the draft at t against the policy's
    own distribution for token t + 2 (its logits at t + 1)."""
    policy_next = jax.lax.stop_gradient(policy_logits[:, 1:])
    draft = jax.lax.stop_gradient(draft_logits[:, :-1])
    pad = lambda x: jnp.pad(x, ((0, 0), (0, 1)))  # noqa: E731  (the last position: mask 0)
    alpha = pad(acceptance_probability(draft, policy_next, temperature=temperature))
    greedy = pad((jnp.argmax(draft, -1) == jnp.argmax(policy_next, -1)).astype(jnp.float32))
    count = jnp.sum(mask)
    return {
        "acceptance": jnp.sum(alpha * mask),
        "acceptance_length": acceptance_length(alpha, mask, num_draft_tokens=k) * count,
        "greedy_acceptance": jnp.sum(greedy * mask),
        "greedy_acceptance_length": acceptance_length(greedy, mask, num_draft_tokens=k) * count,
    }


def _pools(run_dir, sampler, prompts, eval_prompts, config, seq_len, stop_tokens):
    """The training and held-out rollout pools: read back if saved, else sampled and saved."""
    out = []
    for name, source, count, offset in (
        ("train", prompts, config.rollout.batches, 0),
        ("heldout", eval_prompts, config.rollout.eval_batches, 100_003),
    ):
        path = run_dir / "rollouts" / f"{name}.npz"
        if path.is_file():
            pool = ro.load_pool(path)
        else:
            pool = ro.generate_rollouts(sampler, source, count=count, config=config.rollout,
                                        seq_len=seq_len, stop_tokens=stop_tokens,
                                        seed_offset=offset)  # fmt: skip
            ro.save_pool(path, pool)
        out.append(pool)
    return out


def _speculative(sampler: models.Sampler, pool, config: MTPConfig, stop_tokens) -> float:
    """Mean acceptance length of real self-speculative decoding on the held-out prompts."""
    prompts = [row[:n].tolist() for row, n in zip(pool["input_ids"], pool["prompt_lengths"])]
    out = sampler(prompts, max_new_tokens=config.rollout.max_new_tokens,
                  sampling=config.rollout.sampling(), stop_tokens=stop_tokens,
                  seed=config.rollout.seed + 7)  # fmt: skip
    return float(out.acceptance_length)


def run_mtp(
    config: MTPConfig,
    *,
    model_config: models.QwenConfig,
    run_dir: os.PathLike | str,
    prompts: Iterator[Mapping[str, Any]],
    eval_prompts: Iterator[Mapping[str, Any]],
    init_policy: Init,
    init_head: Init,
    stop_tokens: tuple[int, ...] = (),
    pad_id: int = 0,
    run_config: Mapping[str, Any] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> MTPResult:
    """Runs (or resumes) MTP draft-head adaptation and returns its before/after figures.

    Args:
      config: the stage config.
      model_config: the policy's config (the head shares it).
      run_dir: checkpoints, metrics, rollouts, the adapted head (`<run>/head`, a
        `save_params` directory) and the summary (`mtp_summary.json` / `.md`).
      prompts, eval_prompts: batches of `prompt_ids` / `prompt_lengths` (e.g.
        `data.opd_prompt_data`), for the training and the held-out rollouts; keep them apart.
      init_policy: `abstract params -> params` of the trained policy (e.g. restore its Orbax
        checkpoint), or `RANDOM` (a random policy; tests and demos only). A random policy is
        saved to `<run>/policy` so the head can be exported with it. The frozen policy is
        never donated: the arrays returned stay valid.
      init_head: `abstract head params -> params` (grafted from a base checkpoint's `mtp.*`
        tensors or a previous head), or `RANDOM` (explicitly starting from scratch).
      stop_tokens, pad_id: the tokenizer's end-of-turn ids and padding id for rollouts.
      run_config: JSON-serialisable config saved with every checkpoint.
      mesh: overrides the mesh built from `config.mesh`.
    """
    start = time.perf_counter()
    run_dir = pathlib.Path(run_dir)
    tcfg = config.trainer
    driver = StageDriver(
        StageConfig(trainer=tcfg, optimizer=config.optimizer, mesh=config.mesh),
        models={
            "policy": ModelSpec(
                build=lambda: models.Qwen(model_config, rngs=nnx.Rngs(tcfg.seed)),
                init=init_policy,
                frozen=True,
            ),
            "head": ModelSpec(
                build=lambda: models.MTPHead(model_config, rngs=nnx.Rngs(tcfg.seed + 1)),
                init=init_head,
            ),
        },
        loss_fn=functools.partial(mtp_stage_loss, aux_loss_coef=config.aux_loss_coef),
        eval_loss_fn=functools.partial(
            mtp_stage_loss,
            aux_loss_coef=config.aux_loss_coef,
            temperature=config.rollout.temperature or 1.0,
            num_draft_tokens=config.num_draft_tokens,
        ),
        run_dir=run_dir,
        run_config=run_config,
        model_config=model_config.to_dict(),
        mesh=mesh,
    )
    policy = driver.frozen_models()["policy"]
    if init_policy == RANDOM and not (run_dir / "policy").is_dir():
        save_params(run_dir / "policy", nnx.state(policy, nnx.Param),
                    model_config=model_config.to_dict())  # fmt: skip
    decode = config.rollout.decode_overrides()
    sampler = models.Sampler(policy, pad_id=pad_id, decode_overrides=decode)
    tick = time.perf_counter()
    train_rows, heldout_rows = _pools(run_dir, sampler, prompts, eval_prompts, config,
                                      tcfg.seq_len, stop_tokens)  # fmt: skip
    _log.info("rollouts: %d train / %d held-out rows in %.1f s", len(train_rows["input_ids"]),
              len(heldout_rows["input_ids"]), time.perf_counter() - tick)  # fmt: skip
    train_pool = ro.RolloutPool(train_rows, batch_size=tcfg.batch_size, seed=tcfg.seed)
    eval_pool = ro.RolloutPool(heldout_rows, batch_size=tcfg.batch_size, shuffle=False)
    heldout = driver.loss_evaluation(eval_pool.batches)
    during = driver.loss_evaluation(eval_pool.batches, max_batches=tcfg.eval_batches)
    restored = driver.start(train_pool, [during])
    speculative = None
    if config.measure_speculative:
        speculative = models.Sampler(policy, mtp=driver.model().head, pad_id=pad_id,
                                     decode_overrides=decode,
                                     num_draft_tokens=config.num_draft_tokens)  # fmt: skip
    measure = functools.partial(_measure, driver=driver, heldout=heldout, rows=heldout_rows,
                                speculative=speculative, config=config,
                                stop_tokens=stop_tokens)  # fmt: skip
    before_path = run_dir / "mtp_before.json"
    if before_path.is_file():  # a resumed run keeps the figures of its start
        before = json.loads(before_path.read_text())
    else:
        before = measure(driver.state)
        files.write_json(before_path, before)
    _log.info("before: %s", before)
    trained = driver.train()
    after = measure(trained.state)
    _log.info("after %d steps: %s", trained.step, after)
    head_dir = save_params(run_dir / "head", nnx.state(driver.model(trained.state).head, nnx.Param),
                           model_config=model_config.to_dict(), overwrite=True)  # fmt: skip
    counts = {k: int(train_rows[k]) for k in ("rollouts", "sampled_tokens", "stopped")}
    result = MTPResult(run_dir=run_dir, step=trained.step, head_dir=head_dir, before=before,
                       after=after, rollouts=counts, seconds=time.perf_counter() - start,
                       summary_path=run_dir / f"{SUMMARY_FILE}.json",
                       resumed_from=restored)  # fmt: skip
    write_summary(result, config)
    return result


def _measure(state, *, driver, heldout, rows, speculative, config, stop_tokens):
    """Held-out figures of `state`'s head; with a sampler, real speculative decoding too."""
    out = driver.evaluate([heldout], state)
    out["tokens"] = out.pop("weight")
    if speculative is not None:  # the train step donates the head: take the state's arrays
        drafter = driver.model(state)
        speculative.update(model=drafter.policy, mtp=drafter.head)  # same program, new weights
        out["speculative_acceptance_length"] = _speculative(speculative, rows, config, stop_tokens)
    return out


_ROWS = (
    ("loss", "held-out cross-entropy of token t+2", "{:.4f}"),
    ("mtp_top1", "top-1 accuracy of the draft", "{:.3f}"),
    ("acceptance", "per-token acceptance (sum of min(p, q))", "{:.3f}"),
    ("acceptance_length", "simulated acceptance length", "{:.3f}"),
    ("greedy_acceptance", "greedy per-token acceptance (argmax match)", "{:.3f}"),
    ("greedy_acceptance_length", "greedy simulated acceptance length", "{:.3f}"),
    ("speculative_acceptance_length", "measured speculative acceptance length", "{:.3f}"),
)


def summary_lines(result: MTPResult, config: MTPConfig) -> list[str]:
    """The before/after table and where things are, as Markdown lines."""
    k, r = config.num_draft_tokens, result.rollouts
    lines = [
        f"MTP adaptation: {result.step} steps in {result.seconds:.0f} s on {r['rollouts']} "
        f"policy rollouts ({r['sampled_tokens']} sampled tokens; temperature "
        f"{config.rollout.temperature}), k = {k} draft tokens.",
        "",
        "| held-out rollouts | before | after |",
        "|---|---|---|",
    ]
    for key, label, fmt in _ROWS:
        if key in result.after:
            before = result.before.get(key, float("nan"))
            lines.append(f"| {label} | {fmt.format(before)} | {fmt.format(result.after[key])} |")
    lines += ["", f"head: {result.head_dir}", f"metrics: {result.run_dir / 'metrics.jsonl'}"]
    return lines


def write_summary(result: MTPResult, config: MTPConfig) -> pathlib.Path:
    """Writes `mtp_summary.json` and `mtp_summary.md` in the run directory, atomically."""
    return _summary.write_summary(
        result.run_dir, SUMMARY_FILE, result, config, summary_lines(result, config)
    )
