"""The trainer loop: pull a batch, run the compiled step, and do side effects through hooks.

The loop owns no maths. Per step it assembles the global batch from this process's rows,
calls the step, and then:

- one step later (so the device always has the next step queued) reads the step's scalar
  metrics: the non-finite guard (stop after `max_nonfinite_steps` skipped steps in a row),
  the progress bar, and a JSONL / TensorBoard record every `log_every` steps (means over
  the interval, plus throughput);
- immediately, with the new state, runs the hooks due at this step: checkpoints every
  `checkpoint_every` steps (with the data-iterator state and the configs), evaluation every
  `eval_every` steps, plots with each checkpoint, and any hook added with `add_hook`.

SIGTERM (and Orbax's multi-host preemption notice) makes the loop save a checkpoint at the
current step and return, so a preempted job resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from hat_jax.checkpoint import CheckpointManager
from hat_jax.metrics import MetricsWriter, Progress, plot_metrics
from hat_jax.sharding import ACTIVATION_RULES, Rules, global_batch
from hat_jax.train._data import DataSource
from hat_jax.train._optimizer import _from_dict
from hat_jax.train._state import TrainState
from hat_jax.train._step import LossOutput

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
      eval_every: evaluate every this many steps (0: never); eval_batches: batches per eval.
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
    SKIP = ("nonfinite_streak",)

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.count = 0
        self.start = time.perf_counter()

    def add(self, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
            self.last[k] = float(v)
        self.count += 1

    def summary(self, tokens_per_step: int) -> dict[str, float]:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        out = {k: v / self.count for k, v in self.sums.items() if k not in self.LAST + self.SKIP}
        out |= {k: self.last[k] for k in self.LAST if k in self.last}
        out["steps_per_second"] = self.count / seconds
        out["tokens_per_second"] = self.count * tokens_per_step / seconds
        return out


class Trainer:
    """Runs a compiled train step over a data source, with hooks at a frequency.

    Args:
      step_fn: the compiled `(state, batch) -> (state, metrics)`.
      state: the train state to start from (fresh or restored).
      data: the data source, positioned to continue from `state` (see `resume`).
      mesh: the device mesh; batches are laid out with `rules`.
      config: the loop schedule.
      run_dir: where metrics, plots and checkpoints go.
      checkpoints: the checkpoint manager (None: no checkpoints).
      run_config / model_config: JSON-serialisable configs saved with each checkpoint.
      eval_fn: a compiled `(state, batch) -> LossOutput` (see `make_eval_step`).
      eval_data: returns a fresh iterator of eval batches (the same batches each time).
    """

    def __init__(
        self,
        *,
        step_fn: Callable,
        state: TrainState,
        data: DataSource,
        mesh: jax.sharding.Mesh,
        config: TrainerConfig,
        run_dir,
        checkpoints: CheckpointManager | None = None,
        run_config: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
        eval_fn: Callable | None = None,
        eval_data: Callable[[], Iterator[Mapping[str, np.ndarray]]] | None = None,
        rules: Rules = ACTIVATION_RULES,
    ):
        self.step_fn, self.state, self.data, self.mesh = step_fn, state, data, mesh
        self.config, self.rules = config, rules
        self.checkpoints = checkpoints
        self.run_config, self.model_config = dict(run_config or {}), dict(model_config or {})
        self.eval_fn, self.eval_data = eval_fn, eval_data
        self.metrics = MetricsWriter(run_dir)
        self.run_dir = self.metrics.run_dir
        self.step = int(jax.device_get(state.step))
        self.last_saved: int | None = None
        self.preempted = False
        self._stop = threading.Event()
        self._hooks: list[_Hook] = []
        if checkpoints is not None:
            self.add_hook(Trainer.save_checkpoint, every=config.checkpoint_every, name="checkpoint")
        if eval_fn is not None and eval_data is not None and config.eval_every:
            self.add_hook(Trainer.evaluate, every=config.eval_every, name="eval")

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
        """Runs `eval_fn` over `eval_batches` batches; logs `eval/*` (token-weighted means)."""
        totals: dict[str, float] = {}
        total, weight = 0.0, 0.0
        for i, batch in enumerate(self.eval_data()):
            if i >= self.config.eval_batches:
                break
            out: LossOutput = jax.device_get(
                self.eval_fn(state, global_batch(batch, self.mesh, self.rules))
            )
            total, weight = total + float(out.total), weight + float(out.weight)
            for k, v in out.metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        norm = max(weight, 1e-9)
        result = {"loss": total / norm, "weight": weight} | {k: v / norm for k, v in totals.items()}
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
        host = {k: float(v) for k, v in jax.device_get(metrics).items()}
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

    def run(self) -> TrainState:
        """Trains until `total_steps`, the data ends, or a stop request; returns the state."""
        cfg = self.config
        progress = Progress(cfg.total_steps, initial=self.step, enabled=cfg.progress)
        handler = None
        if threading.current_thread() is threading.main_thread():
            handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        window, pending = _Window(), None
        try:
            while self.step < cfg.total_steps:
                if self._stop_requested(self.step):
                    self.preempted = True
                    break
                try:
                    local = next(self.data)
                except StopIteration:
                    progress.write(f"data source exhausted after step {self.step}")
                    break
                batch = global_batch(local, self.mesh, self.rules)
                self.state, metrics = self.step_fn(self.state, batch)
                self.step += 1
                if pending is not None:
                    window = self._process(*pending, window, progress)
                pending = (self.step, metrics)
                due = [hook for hook in self._hooks if self.step % hook.every == 0]
                if due:  # hooks see the state, so log this step first: a checkpoint's
                    window = self._process(*pending, window, progress)  # metrics are on disk
                    pending = None
                for hook in due:
                    hook.fn(self, self.step, self.state)
            if pending is not None:
                window = self._process(*pending, window, progress)
            self.save_checkpoint(self.step, self.state)
        finally:
            progress.close()
            if handler is not None:
                signal.signal(signal.SIGTERM, handler)
            if self.checkpoints is not None:
                self.checkpoints.wait()
            self.metrics.flush()
            self._plot()
        return self.state

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
