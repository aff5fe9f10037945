"""MTP draft-head adaptation as one library call: `run_mtp`.

The policy is frozen; a draft head grafted onto it (from a base checkpoint, a previous run, or
a random initialisation when asked for) is trained with the multi-token cross-entropy
(`rl.distill.mtp_loss`: the head at position t predicts token t + 2) on rollouts of the policy
itself (`rl._mtp_rollouts`). Held-out rollouts give the before/after figures: the loss, the
per-token acceptance α = Σ_v min(p, q) of speculative sampling and the simulated acceptance
length with k drafts (`rl.distill.acceptance_probability` / `acceptance_length`), at the
rollout temperature and greedily.

The machinery is `hat_jax.train`'s: `make_train_step` with this stage's loss, AdamW, the
`Trainer` loop (metrics, evaluation, checkpoints, SIGTERM), resumable runs. The compiled model
is `Drafter(policy, head)`: only the head's parameters are the `TrainState.params` (optimiser
state for the head alone); the policy rides in `model_state`, is never differentiated, and is
left out of the stage's checkpoints (it is the input, restored from where it came from).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import models
from hat_jax import files
from hat_jax.checkpoint import CheckpointManager, save_params
from hat_jax.sharding import (
    PARAM_RULES,
    MeshConfig,
    init_sharded,
    make_mesh,
    shardings_of,
    state_shardings,
)
from hat_jax.train import (
    LossOutput,
    OptimizerConfig,
    Trainer,
    TrainerConfig,
    TrainState,
    abstract_train_state,
    batch_shardings_for,
    learning_rate_schedule,
    make_eval_step,
    make_optimizer,
    make_train_step,
)
from rl import _mtp_rollouts as ro
from rl.distill import acceptance_length, acceptance_probability, mtp_loss, mtp_targets

_log = logging.getLogger(__name__)

HEAD_PARAMS = nnx.All(nnx.Param, nnx.PathContains("head"))
CHECKPOINTS_DIR = "checkpoints"
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
        out = dataclasses.asdict(self)
        return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in out.items()}


class Drafter(nnx.Module):
    """The frozen policy and its draft head, compiled together by the stage's step."""

    def __init__(self, policy: models.Qwen, head: models.MTPHead):
        self.policy = policy
        self.head = head


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


def _abstract(config: models.QwenConfig, mesh):
    """(graphdef, head params, everything else) of a `Drafter`, as sharded shape structs."""
    with nnx.use_eager_sharding(False):
        abstract = nnx.eval_shape(
            lambda: Drafter(
                models.Qwen(config, rngs=nnx.Rngs(0)), models.MTPHead(config, rngs=nnx.Rngs(0))
            )  # fmt: skip
        )
    graphdef, params, rest = nnx.split(abstract, HEAD_PARAMS, ...)

    def attach(state):
        shardings = state_shardings(state, mesh, PARAM_RULES)
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
        )

    return graphdef, attach(params), attach(rest)


def _without_policy(state: nnx.State) -> nnx.State:
    return nnx.State({k: v for k, v in state.items() if k != "policy"})


class _HeadCheckpoints(CheckpointManager):
    """Checkpoints of the head's train state; the frozen policy is never written."""

    def __init__(self, directory, *, frozen: nnx.State, **kwargs):
        super().__init__(directory, **kwargs)
        self.frozen = frozen

    def save(self, step, state, **kwargs):
        super().save(step, state.replace(model_state=_without_policy(state.model_state)), **kwargs)

    def restore(self, abstract_state, *, step=None):
        slim = abstract_state.replace(model_state=_without_policy(abstract_state.model_state))
        restored = super().restore(slim, step=step)
        if restored is None:
            return None
        state = restored.state.replace(model_state=self.frozen)
        return dataclasses.replace(restored, state=state)


RANDOM = "random"
Init = Callable[[Any], Any] | str


def _build(module_fn: Callable[[], nnx.Module], init: Init, mesh) -> nnx.Module:
    """A module in its sharded layout: random (`RANDOM`) or `init(abstract params) -> params`."""
    if isinstance(init, str):
        if init != RANDOM:
            raise ValueError(f"run_mtp: an initialiser is a callable or {RANDOM!r}, got {init!r}")
        return init_sharded(module_fn, mesh, PARAM_RULES)
    with nnx.use_eager_sharding(False):
        graphdef, params, rest = nnx.split(nnx.eval_shape(module_fn), nnx.Param, ...)
    abstract = _attach(params, mesh)
    # Laid out as the step expects (a no-op for arrays already there, e.g. restored shards).
    params = jax.device_put(init(abstract), shardings_of(abstract))

    def others():  # XLA drops the unused parameter initialisers.
        with nnx.use_eager_sharding(False):
            return nnx.split(module_fn(), nnx.Param, ...)[2]

    rest = jax.jit(others, out_shardings=shardings_of(_attach(rest, mesh)))()
    return nnx.merge(graphdef, params, rest)


def _attach(state, mesh):
    shardings = state_shardings(state, mesh, PARAM_RULES)
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
    )


def _fresh_state(params, rest, optimizer, mesh, seed: int) -> TrainState:
    abstract = abstract_train_state(params, rest, optimizer, mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings_of(abstract.opt_state))(params)
    scalar = lambda v: jax.device_put(jnp.asarray(v, jnp.int32), abstract.step.sharding)  # noqa: E731
    key = jax.random.key_data(jax.random.key(seed))
    return TrainState(step=scalar(0), params=params, model_state=rest, opt_state=opt_state,
                      rng=jax.device_put(key, abstract.rng.sharding),
                      nonfinite_streak=scalar(0), nonfinite_total=scalar(0))  # fmt: skip


def _evaluate(eval_fn, state: TrainState, pool: ro.RolloutPool, mesh) -> dict[str, float]:
    """Token-weighted means of the loss and acceptance figures over one pass of `pool`."""
    from hat_jax.sharding import global_batch

    total, weight, sums = 0.0, 0.0, {}
    for batch in pool.batches():
        out = jax.device_get(eval_fn(state, global_batch(batch, mesh)))
        total, weight = total + float(out.total), weight + float(out.weight)
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    norm = max(weight, 1e-9)
    return {"loss": total / norm, "tokens": weight} | {k: v / norm for k, v in sums.items()}


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
        saved to `<run>/policy` so the head can be exported with it. The stage owns the arrays
        returned: the compiled step donates its state (the frozen policy passes through it
        without a copy), so do not hand it arrays you still use.
      init_head: `abstract head params -> params` (grafted from a base checkpoint's `mtp.*`
        tensors or a previous head), or `RANDOM` (explicitly starting from scratch).
      stop_tokens, pad_id: the tokenizer's end-of-turn ids and padding id for rollouts.
      run_config: JSON-serialisable config saved with every checkpoint.
      mesh: overrides the mesh built from `config.mesh`.
    """
    start = time.perf_counter()
    run_dir = pathlib.Path(run_dir)
    mesh = mesh or make_mesh(config.mesh)
    tcfg = config.trainer
    policy, head = _models(model_config, run_dir, init_policy, init_head, mesh, tcfg.seed)
    graphdef, params, rest = nnx.split(Drafter(policy, head), HEAD_PARAMS, ...)
    decode = config.rollout.decode_overrides()
    sampler = models.Sampler(policy, pad_id=pad_id, decode_overrides=decode)
    tick = time.perf_counter()
    train_rows, heldout_rows = _pools(run_dir, sampler, prompts, eval_prompts, config,
                                      tcfg.seq_len, stop_tokens)  # fmt: skip
    _log.info("rollouts: %d train / %d held-out rows in %.1f s", len(train_rows["input_ids"]),
              len(heldout_rows["input_ids"]), time.perf_counter() - tick)  # fmt: skip
    train_pool = ro.RolloutPool(train_rows, batch_size=tcfg.batch_size, seed=tcfg.seed)
    eval_pool = ro.RolloutPool(heldout_rows, batch_size=tcfg.batch_size, shuffle=False)

    optimizer = make_optimizer(config.optimizer, params)
    abstract = abstract_train_state(params, rest, optimizer, mesh)
    checkpoints = _HeadCheckpoints(run_dir / CHECKPOINTS_DIR, frozen=rest,
                                   keep=tcfg.keep_checkpoints,
                                   async_save=tcfg.async_checkpoints)  # fmt: skip
    restored = checkpoints.restore(abstract)
    if restored is not None:
        state = restored.state
        train_pool.set_state(restored.data_state)
    else:
        state = _fresh_state(params, rest, optimizer, mesh, tcfg.seed)
    step_fn, eval_fn = _compiled_steps(config, graphdef, optimizer, abstract, mesh)
    speculative = None
    if config.measure_speculative:
        speculative = models.Sampler(policy, mtp=head, pad_id=pad_id, decode_overrides=decode,
                                     num_draft_tokens=config.num_draft_tokens)  # fmt: skip
    measure = functools.partial(_measure, eval_fn=eval_fn, pool=eval_pool, rows=heldout_rows,
                                speculative=speculative, config=config, mesh=mesh,
                                stop_tokens=stop_tokens)  # fmt: skip
    before_path = run_dir / "mtp_before.json"
    if before_path.is_file():  # a resumed run keeps the figures of its start
        before = json.loads(before_path.read_text())
    else:
        before = measure(state, graphdef)
        files.write_json(before_path, before)
    _log.info("before: %s", before)

    trainer = Trainer(step_fn=step_fn, state=state, data=train_pool, mesh=mesh, config=tcfg,
                      run_dir=run_dir, checkpoints=checkpoints, run_config=run_config,
                      model_config=model_config.to_dict(), eval_fn=eval_fn,
                      eval_data=eval_pool.batches)  # fmt: skip
    if restored is not None:
        trainer.metrics.rewind(restored.step)
        trainer.last_saved = restored.step
    try:
        state = trainer.run()
    finally:
        trainer.close()
    after = measure(state, graphdef)
    _log.info("after %d steps: %s", trainer.step, after)
    adapted = nnx.merge(graphdef, state.params, state.model_state)
    head_dir = save_params(run_dir / "head", nnx.state(adapted.head, nnx.Param),
                           model_config=model_config.to_dict(), overwrite=True)  # fmt: skip
    counts = {k: int(train_rows[k]) for k in ("rollouts", "sampled_tokens", "stopped")}
    result = MTPResult(run_dir=run_dir, step=trainer.step, head_dir=head_dir, before=before,
                       after=after, rollouts=counts, seconds=time.perf_counter() - start,
                       summary_path=run_dir / f"{SUMMARY_FILE}.json",
                       resumed_from=restored.step if restored is not None else None)  # fmt: skip
    write_summary(result, config)
    return result


def _models(model_config, run_dir: pathlib.Path, init_policy, init_head, mesh, seed: int):
    """The frozen policy and the head to adapt, in their sharded layouts."""
    checkpoints = run_dir / CHECKPOINTS_DIR
    resuming = checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())
    policy = _build(lambda: models.Qwen(model_config, rngs=nnx.Rngs(seed)), init_policy, mesh)
    if init_policy == RANDOM and not (run_dir / "policy").is_dir():
        save_params(run_dir / "policy", nnx.state(policy, nnx.Param),
                    model_config=model_config.to_dict())  # fmt: skip
    head_init = RANDOM if resuming else init_head  # the checkpoint replaces it
    head = _build(lambda: models.MTPHead(model_config, rngs=nnx.Rngs(seed + 1)), head_init, mesh)
    return policy, head


def _compiled_steps(config: MTPConfig, graphdef, optimizer, abstract, mesh):
    """The train step (loss only) and the eval step (loss and acceptance figures)."""
    loss = functools.partial(mtp_stage_loss, aux_loss_coef=config.aux_loss_coef)
    scored = functools.partial(loss, temperature=config.rollout.temperature or 1.0,
                               num_draft_tokens=config.num_draft_tokens)  # fmt: skip
    shardings, batch_shardings = shardings_of(abstract), batch_shardings_for(mesh)
    step_fn = make_train_step(loss, graphdef=graphdef, optimizer=optimizer,
                              state_shardings=shardings, batch_shardings=batch_shardings,
                              micro_batches=config.trainer.micro_batches,
                              learning_rate_fn=learning_rate_schedule(config.optimizer))  # fmt: skip
    eval_fn = make_eval_step(scored, graphdef=graphdef, state_shardings=shardings,
                             batch_shardings=batch_shardings)  # fmt: skip
    return step_fn, eval_fn


def _measure(state, graphdef, *, eval_fn, pool, rows, speculative, config, mesh, stop_tokens):
    """Held-out figures of `state`'s head; with a sampler, real speculative decoding too."""
    out = _evaluate(eval_fn, state, pool, mesh)
    if speculative is not None:  # the train step donates the policy: take the state's arrays
        drafter = nnx.merge(graphdef, state.params, state.model_state)
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
    record = result.to_dict() | {"config": dataclasses.asdict(config)}
    files.write_json(result.run_dir / f"{SUMMARY_FILE}.json", record, default=str)
    files.write_text(
        result.run_dir / f"{SUMMARY_FILE}.md", "\n".join(summary_lines(result, config)) + "\n"
    )
    return result.summary_path
