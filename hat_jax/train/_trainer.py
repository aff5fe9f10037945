# Over 400 lines: the loop, its resume and its hooks share the trainer's state.
"""The trainer loop: pull a batch, run the compiled step, and do side effects through hooks.

The loop owns no maths. Per step it takes this process's rows from the data source (a
`DataSource`, or an `OnPolicySource` that samples with the current weights), assembles the
global batch, calls the step, and then:

- one step later (so the device always has the next step queued) reads the step's scalar
  metrics: the non-finite guard (stop after `max_nonfinite_steps` skipped steps in a row),
  the progress bar, and a JSONL / TensorBoard record every `log_every` steps (means over
  the interval, plus throughput and the split of wall time between getting the batch
  (`data_seconds`: sampling, for an on-policy source) and the step itself
  (`learn_seconds`; with an on-policy source each step is awaited, since the next batch
  needs its weights, so the two are timed apart));
- immediately, with the new state, runs the hooks due at this step: evaluation every
  `eval_every` steps and at the last step, then checkpoints every `checkpoint_every` steps
  (with the data-iterator state and the configs; after the evaluation, so a checkpoint's
  step is fully logged), plots with each checkpoint, and any hook added with `add_hook`.

`resume` puts the trainer where the newest readable checkpoint left a run (state, data
position, metrics file, what is already saved). SIGTERM (and Orbax's multi-host preemption
notice) makes the loop save a checkpoint at the current step and return, so a preempted job
resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hat_jax.checkpoint import CheckpointError, CheckpointManager, ProcessStates, Restored
from hat_jax.metrics import MetricsWriter, Progress, plot_metrics, read_metrics
from hat_jax.sharding import ACTIVATION_RULES, Rules, global_batch
from hat_jax.train._data import DataSource, OnPolicySource
from hat_jax.train._optimizer import _from_dict
from hat_jax.train._state import TrainState, merge_model
from hat_jax.train._step import LossOutput

# state -> scalar figures, logged under `eval/` (see `Trainer.evaluate`).
Evaluation = Callable[[TrainState], Mapping[str, float]]

_log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient norm."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The loop's schedule and batch geometry.

    Attributes:
      total_steps: train until the state's step reaches this.
      batch_size: global rows per step; seq_len: tokens per row.
      micro_batches: gradient accumulation micro-batches per step.
      seed: the RNG seed of the train state.
      log_every: write a metrics record every this many steps.
      eval_every: evaluate every this many steps (0: only at the last step; evaluations run
        at the last step in any case); eval_batches: batches per loss evaluation.
      checkpoint_every: save every this many steps (0: only at the end).
      keep_checkpoints: newest checkpoints kept; async_checkpoints: save in the background.
      max_nonfinite_steps: stop after this many skipped (non-finite) steps in a row.
      progress: show a progress bar on the main process.
      plots: draw PNG curves (the overview with each checkpoint, every metric at the end).
    """

    total_steps: int
    batch_size: int
    seq_len: int
    micro_batches: int = 1
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0
    eval_batches: int = 4
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    async_checkpoints: bool = True
    max_nonfinite_steps: int = 10
    progress: bool = True
    plots: bool = True

    def __post_init__(self):
        positive = ("total_steps", "batch_size", "seq_len", "micro_batches", "log_every")
        bad = {k: getattr(self, k) for k in positive if getattr(self, k) < 1}
        bad |= {
            k: getattr(self, k) for k in ("eval_every", "checkpoint_every") if getattr(self, k) < 0
        }
        if self.max_nonfinite_steps < 1 or self.keep_checkpoints < 1:
            bad |= {
                "max_nonfinite_steps": self.max_nonfinite_steps,
                "keep_checkpoints": self.keep_checkpoints,
            }
        if bad:
            raise ValueError(f"TrainerConfig: invalid values {bad}")
        if self.batch_size % self.micro_batches:
            raise ValueError(
                f"TrainerConfig: batch_size {self.batch_size} is not divisible by "
                f"micro_batches {self.micro_batches}"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainerConfig:
        return _from_dict(cls, values)


@dataclasses.dataclass
class _Hook:
    fn: Callable[[Trainer, int, TrainState], None]
    every: int
    name: str


class _Window:
    """Running means of step metrics between two log records."""

    LAST = ("nonfinite_total",)  # counters: the latest value, not a mean
    SKIP = ("nonfinite_streak", "loop_seconds")

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}
        self.count = 0
        self.start = time.perf_counter()

    def add(self, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
            self.counts[k] = self.counts.get(k, 0) + 1
            self.last[k] = float(v)
        self.count += 1

    def summary(self, tokens_per_step: int) -> dict[str, float]:
        """Each metric's mean over the steps that reported it (an on-policy source reports
        some figures only on a rollout's first step), counters' latest value, throughput."""
        # The loop's own time per step where it was measured (the window is processed a step
        # late, so its wall clock would miss or double-count the boundary steps).
        seconds = self.sums.get("loop_seconds") or time.perf_counter() - self.start
        seconds = max(seconds, 1e-9)
        out = {k: v / self.counts[k] for k, v in self.sums.items()
               if k not in self.LAST + self.SKIP}  # fmt: skip
        out |= {k: self.last[k] for k in self.LAST if k in self.last}
        out["steps_per_second"] = self.count / seconds
        out["tokens_per_second"] = self.count * tokens_per_step / seconds
        if "data_seconds" in out and "learn_seconds" not in out:
            out["learn_seconds"] = max(seconds / self.count - out["data_seconds"], 0.0)
        return out


def loss_evaluation(
    eval_fn: Callable,
    batches: Callable[[], Iterator[Mapping[str, np.ndarray]]],
    mesh: jax.sharding.Mesh,
    *,
    max_batches: int | None = None,
    rules: Rules = ACTIVATION_RULES,
) -> Evaluation:
    """An evaluation: `eval_fn` (a compiled `(state, batch) -> LossOutput`, see
    `make_eval_step`) over a fresh iterator of `batches()` (at most `max_batches`): the
    token-weighted `loss`, its `weight` and each metric per unit of weight."""

    def evaluate(state: TrainState) -> dict[str, float]:
        totals: dict[str, float] = {}
        total, weight = 0.0, 0.0
        for i, batch in enumerate(batches()):
            if max_batches is not None and i >= max_batches:
                break
            out: LossOutput = jax.device_get(eval_fn(state, global_batch(batch, mesh, rules)))
            total, weight = total + float(out.total), weight + float(out.weight)
            for k, v in out.metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        norm = max(weight, 1e-9)
        return {"loss": total / norm, "weight": weight} | {k: v / norm for k, v in totals.items()}

    return evaluate


class Trainer:
    """Runs a compiled train step over a data source, with hooks at a frequency.

    Args:
      step_fn: the compiled `(state, batch) -> (state, metrics)`.
      data: the data source: a `DataSource`, or an `OnPolicySource` (then `graphdef` is
        needed to hand it the current model).
      mesh: the device mesh; batches are laid out with `rules`.
      config: the loop schedule.
      run_dir: where metrics, plots and checkpoints go.
      state: the train state to start from; or call `resume` (and set `state` if it finds
        no checkpoint) before `run`.
      checkpoints: the checkpoint manager (None: no checkpoints).
      run_config / model_config: JSON-serialisable configs saved with each checkpoint.
      evaluations: run every `eval_every` steps; their figures are logged under `eval/`.
      graphdef: the static graph of the model(s) in the state (see `merge_model`).
      derive_metrics: step metrics -> more figures (e.g. ratios of two of them), per step.
    """

    def __init__(
        self,
        *,
        step_fn: Callable,
        data: DataSource | OnPolicySource,
        mesh: jax.sharding.Mesh,
        config: TrainerConfig,
        run_dir,
        state: TrainState | None = None,
        checkpoints: CheckpointManager | None = None,
        run_config: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
        evaluations: Sequence[Evaluation] = (),
        graphdef: Any = None,
        derive_metrics: Callable[[Mapping[str, float]], Mapping[str, float]] | None = None,
        rules: Rules = ACTIVATION_RULES,
    ):
        if isinstance(data, OnPolicySource) and graphdef is None:
            raise ValueError("Trainer: an on-policy data source needs the model's graphdef")
        self.step_fn, self.data, self.mesh = step_fn, data, mesh
        self.config, self.rules, self.graphdef = config, rules, graphdef
        self.checkpoints = checkpoints
        self.run_config, self.model_config = dict(run_config or {}), dict(model_config or {})
        self.evaluations = tuple(evaluations)
        self.derive_metrics = derive_metrics
        self.metrics = MetricsWriter(run_dir)
        self.run_dir = self.metrics.run_dir
        self.state: TrainState | None = None
        self.step = 0
        if state is not None:
            self.set_state(state)
        self.last_saved: int | None = None
        self.preempted = False
        self._stop = threading.Event()
        self._hooks: list[_Hook] = []
        # Evaluation before the checkpoint of the same step: a committed checkpoint then
        # implies its step's evaluation is logged, so a run killed between the two and
        # resumed from that checkpoint does not go on without the evaluation.
        if self.evaluations and config.eval_every:
            self.add_hook(Trainer.evaluate, every=config.eval_every, name="eval")
        if checkpoints is not None:
            self.add_hook(Trainer.save_checkpoint, every=config.checkpoint_every, name="checkpoint")

    def set_state(self, state: TrainState) -> None:
        """Starts (or continues) from `state`."""
        self.state = state
        self.step = int(jax.device_get(state.step))

    def resume(self, abstract_state: TrainState, *, frozen: Any = None) -> Restored | None:
        """Restores the newest readable checkpoint into `abstract_state`: the train state (with
        `frozen` as its frozen part, which checkpoints never hold), the data source's position,
        the metrics file (records past the checkpoint are dropped: they will be written again)
        and what is already saved (resuming a finished run saves nothing). Returns None, and
        changes nothing, when there is no checkpoint."""
        if self.checkpoints is None:
            return None
        restored = self.checkpoints.restore(abstract_state)
        if restored is None:
            return None
        for step, error in restored.skipped:
            _log.warning("checkpoint %d was unreadable and set aside: %s", step, error)
        self.set_state(restored.state.replace(frozen=frozen))
        if isinstance(restored.data_state, ProcessStates):
            self._adopt_process_states(restored.step, restored.data_state)
        elif restored.data_state is not None:
            self.data.set_state(restored.data_state)
        self.metrics.rewind(restored.step)
        self.last_saved = restored.step
        _log.info("resumed from step %d", restored.step)
        return restored

    def _adopt_process_states(self, step: int, saved: ProcessStates) -> None:
        """A checkpoint of another process count: a source that re-splits its position (its
        `set_state` takes the list of every process's state, e.g. `data.DataIterator`) takes
        its part; any other source cannot continue exactly, so the run stops."""
        if not getattr(self.data, "resplits_states", False):
            raise CheckpointError(
                f"checkpoint step {step} was written by {saved.count} processes and this run "
                f"has {jax.process_count()}: the data source {type(self.data).__name__} cannot "
                f"re-split its position; resume with {saved.count} processes"
            )
        try:
            self.data.set_state(list(saved.states))
        except ValueError as err:
            raise CheckpointError(
                f"checkpoint step {step} was written by {saved.count} processes and this run "
                f"has {jax.process_count()}: {err}"
            ) from err

    def model(self, state: TrainState | None = None) -> Any:
        """The model(s) of `state` (default: the current state) as one module."""
        if self.graphdef is None:
            raise ValueError("Trainer.model: the trainer was built without a graphdef")
        return merge_model(self.graphdef, self.state if state is None else state)

    def add_hook(self, fn: Callable[[Trainer, int, TrainState], None], *, every: int, name=None):
        """Calls `fn(trainer, step, state)` after every `every`-th step (0: never)."""
        if every:
            self._hooks.append(_Hook(fn, every, name or getattr(fn, "__name__", "hook")))

    # -- built-in hooks -----------------------------------------------------------------------

    def save_checkpoint(self, step: int, state: TrainState) -> None:
        """Saves `state` with the data position and configs as checkpoint `step`, and plots."""
        if self.checkpoints is None or self.last_saved == step:
            return
        self.checkpoints.save(
            step,
            state,
            data_state=self.data.get_state(),
            config=self.run_config,
            model_config=self.model_config,
        )
        self.last_saved = step
        self.metrics.flush()
        self._plot(overview_only=True)

    def evaluate(self, step: int, state: TrainState) -> dict[str, float]:
        """Runs every evaluation on `state` and logs their figures as `eval/*` at `step`."""
        result: dict[str, float] = {}
        for evaluation in self.evaluations:
            result |= dict(evaluation(state))
        self.metrics.write(step, result, prefix="eval/")
        return result

    # -- the loop -----------------------------------------------------------------------------

    def _check(self, step: int, metrics: Mapping[str, float]) -> None:
        streak = int(metrics["nonfinite_streak"])
        if streak >= self.config.max_nonfinite_steps:
            latest = self.checkpoints.latest_step() if self.checkpoints else None
            raise NonFiniteError(
                f"stopping at step {step}: {streak} consecutive steps had a non-finite loss or "
                f"gradient norm (last loss={metrics['loss']}, grad_norm={metrics['grad_norm']}); "
                "their updates were skipped. Latest checkpoint: "
                f"{latest if latest is not None else 'none'}. Lower the learning rate, inspect "
                "the data of these steps, or raise max_nonfinite_steps."
            )
        if metrics["skipped"]:
            _log.warning("step %d: non-finite loss or gradient; update skipped", step)

    def _process(self, step: int, metrics, window: _Window, progress: Progress) -> _Window:
        metrics, extra = metrics
        host = {k: float(v) for k, v in jax.device_get(metrics).items()}
        host |= {k: float(v) for k, v in extra.items()}
        if self.derive_metrics is not None:
            host |= {k: float(v) for k, v in self.derive_metrics(host).items()}
        self._check(step, host)
        window.add(host)
        progress.update(step, host)
        if step % self.config.log_every == 0 or step == self.config.total_steps:
            tokens = self.config.batch_size * self.config.seq_len
            record = window.summary(tokens)
            self.metrics.write(step, record)
            return _Window()
        return window

    def _on_sigterm(self, signum, frame) -> None:
        _log.warning("SIGTERM: saving a checkpoint at the next step and stopping")
        self._stop.set()

    def _stop_requested(self, step: int) -> bool:
        if self._stop.is_set():
            return True
        try:
            return self.checkpoints is not None and self.checkpoints.reached_preemption(step)
        except Exception:  # No preemption service outside a multi-host job.
            return False

    def _next_batch(self) -> tuple[Mapping[str, np.ndarray], dict[str, float]]:
        """This process's rows of the next batch, and host figures about them (the source's
        own, and `data_seconds`: the time it took)."""
        start = time.perf_counter()
        if isinstance(self.data, OnPolicySource):
            local, extra = self.data.next_batch(self.model())
            extra = dict(extra)
        else:
            local, extra = next(self.data), {}
        extra["data_seconds"] = time.perf_counter() - start
        return local, extra

    def run(self) -> TrainState:
        """Trains until `total_steps`, the data ends, or a stop request; returns the state."""
        if self.state is None:
            raise ValueError("Trainer.run: no state (pass one, or call resume / set_state)")
        cfg = self.config
        progress = Progress(cfg.total_steps, initial=self.step, enabled=cfg.progress)
        handler = None
        if threading.current_thread() is threading.main_thread():
            handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        window, pending = _Window(), None
        tick = time.perf_counter()
        try:
            while self.step < cfg.total_steps:
                if self._stop_requested(self.step):
                    self.preempted = True
                    break
                try:
                    local, extra = self._next_batch()
                except StopIteration:
                    progress.write(f"data source exhausted after step {self.step}")
                    break
                batch = global_batch(local, self.mesh, self.rules)
                start = time.perf_counter()
                self.state, metrics = self.step_fn(self.state, batch)
                if isinstance(self.data, OnPolicySource):
                    # The next batch is sampled with this step's weights anyway: wait for them
                    # here, so sampling and learning are timed apart.
                    jax.block_until_ready(self.state.params)
                    extra["learn_seconds"] = time.perf_counter() - start
                now = time.perf_counter()
                extra["loop_seconds"], tick = now - tick, now
                self.step += 1
                if pending is not None:
                    window = self._process(*pending, window, progress)
                pending = (self.step, (metrics, extra))
                due = [hook for hook in self._hooks if self.step % hook.every == 0]
                if due:  # hooks see the state, so log this step first: a checkpoint's
                    window = self._process(*pending, window, progress)  # metrics are on disk
                    pending = None
                hooks_start = time.perf_counter()
                for hook in due:
                    hook.fn(self, self.step, self.state)
                tick += time.perf_counter() - hooks_start  # a step's time leaves its hooks out
            if pending is not None:
                window = self._process(*pending, window, progress)
            self.save_checkpoint(self.step, self.state)
            self._final_evaluation()
        finally:
            progress.close()
            if handler is not None:
                signal.signal(signal.SIGTERM, handler)
            if self.checkpoints is not None:
                self.checkpoints.wait()
            self.metrics.flush()
            self._plot()
        return self.state

    def _final_evaluation(self) -> None:
        """Evaluates the last step too, unless the schedule just did (or a stop cut the run
        short, or this step's figures are already logged)."""
        every = self.config.eval_every
        if not self.evaluations or self.preempted or (every and self.step % every == 0):
            return
        self.metrics.flush()
        logged = any(
            r.get("step") == self.step and any(k.startswith("eval/") for k in r)
            for r in read_metrics(self.run_dir)
        )
        if not logged:
            self.evaluate(self.step, self.state)

    def _plot(self, overview_only: bool = False) -> None:
        if not (self.metrics.enabled and self.config.plots):
            return
        try:
            plot_metrics(self.run_dir, overview_only=overview_only)
        except Exception as err:  # Plots are a convenience; never lose a run to one.
            _log.warning("plotting failed: %s", err)

    def close(self) -> None:
        self.metrics.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
