# Over 400 lines: the driver is one object (mesh, state, restore, trainer) sharing its fields.
"""The stage driver every training stage runs on: `StageDriver`, and `run_stage` for the
common case.

A stage supplies only what differs between stages:

- its models (`ModelSpec`: how to build each, where its weights come from, whether it is
  frozen): the trained policy alone (SFT), the policy and a frozen teacher (OPD), the policy
  and a frozen reference (RL), a draft head over the frozen policy (MTP adaptation);
- what trains among the non-frozen models (a filter; `nnx.Param` by default);
- a loss in the `LossOutput` form, called with the models as one module (the model itself
  for a single-model stage; else a `Models` bundle, `models.policy`, `models.teacher`, ...);
- a batch source (`DataSource`, or an `OnPolicySource` that samples with current weights);
- evaluation callbacks.

The driver owns the rest: the mesh and the abstract sharded train state; the frozen models,
read from their sources on every start (never checkpointed); a fresh start from the trained
models' sources or a resume from the newest readable checkpoint (the `Trainer`'s own
`resume`); the compiled train and eval steps; the loop with its checkpoints, metrics, plots
and evaluations; and the result.

    driver = StageDriver(config, models={"policy": ModelSpec(build=..., init=...),
                                         "teacher": ModelSpec(build=..., init=..., frozen=True)},
                         loss_fn=loss, run_dir="runs/opd", checkpoint_root="policy")
    driver.start(source, evals)     # resumes or initialises; driver.model() is usable now
    driver.log_evaluation()         # e.g. the figures before training
    result = driver.train()         # evaluations every eval_every steps and at the end
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from hat_jax import host_memory
from hat_jax.checkpoint import CheckpointManager
from hat_jax.metrics import METRICS_FILE, read_metrics
from hat_jax.sharding import (
    ACTIVATION_RULES,
    PARAM_RULES,
    MeshConfig,
    batch_spec,
    data_parallel_size,
    init_sharded,
    make_mesh,
    shardings_of,
)
from hat_jax.train._data import BATCH_KEYS, DataSource, OnPolicySource
from hat_jax.train._optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer
from hat_jax.train._state import (
    Filter,
    TrainState,
    abstract_parts,
    abstract_train_state,
    init_train_state,
    merge_model,
)
from hat_jax.train._step import LossFn, make_eval_step, make_train_step
from hat_jax.train._trainer import Evaluation, Trainer, TrainerConfig, loss_evaluation

CHECKPOINTS_DIR = "checkpoints"
RANDOM = "random"
# Where a model's parameters come from: RANDOM (the module's own initialisers), or a
# function `abstract params -> params` (sharded `jax.ShapeDtypeStruct`s in, arrays out), e.g.
# restoring an Orbax checkpoint or streaming Hugging Face weights into that layout.
Init = Callable[[Any], Any] | str


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model of a stage.

    Attributes:
      build: builds the module (e.g. `lambda: Qwen(config, rngs=nnx.Rngs(seed))`); only
        traced abstractly, or run inside one sharded jitted initialiser. Its config sets the
        model's dtypes (a frozen teacher may be bfloat16 while the student trains in float32).
      init: `RANDOM`, or `abstract params -> params`.
      frozen: an input of the stage (a teacher, a reference, the policy under an MTP head):
        never differentiated or checkpointed, read from `init` again on every start.
    """

    build: Callable[[], nnx.Module]
    init: Init = RANDOM
    frozen: bool = False

    def __post_init__(self):
        if isinstance(self.init, str) and self.init != RANDOM:
            raise ValueError(
                f"ModelSpec.init: a function `abstract params -> params` or {RANDOM!r}, "
                f"got {self.init!r}"
            )


class Models(nnx.Module):
    """Several models as one module, each an attribute by its stage name."""

    def __init__(self, **models: nnx.Module):
        for name, module in models.items():
            setattr(self, name, module)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageConfig:
    """What every stage's loop needs: its schedule, optimiser and mesh."""

    trainer: TrainerConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()


@dataclasses.dataclass(frozen=True)
class StageResult:
    """Where a finished (or stopped) stage left things."""

    run_dir: pathlib.Path
    step: int
    checkpoint_dir: pathlib.Path | None
    metrics_path: pathlib.Path
    plots_dir: pathlib.Path
    final_metrics: dict[str, Any]
    resumed_from: int | None
    preempted: bool
    state: TrainState | None = dataclasses.field(default=None, repr=False, compare=False)


def batch_shardings_for(mesh: jax.sharding.Mesh, keys=BATCH_KEYS) -> dict[str, NamedSharding]:
    """The shardings of a packed-token batch: rows over the data-parallel axes."""
    return {k: NamedSharding(mesh, batch_spec(mesh, 2, ACTIVATION_RULES)) for k in keys}


def _via_host(values: Any, shardings: Any) -> Any:
    """Process-local arrays bound for a layout spanning other processes, as host arrays: a
    `device_put` of a single-device array there builds an array whose shards JAX cannot list
    (one device per process), while one of host data is laid out like any other."""
    if jax.process_count() == 1:
        return values

    def one(x, sharding):
        local = isinstance(x, jax.Array) and x.is_fully_addressable
        return np.asarray(x) if local and not sharding.is_fully_addressable else x

    return jax.tree.map(one, values, shardings)


def build_sharded(build: Callable[[], nnx.Module], init: Init, mesh) -> nnx.Module:
    """The module in its sharded layout: random (`RANDOM`), or its parameters from
    `init(abstract params)` (random parameters are then never computed) and its other state
    from its own initialisers."""
    if isinstance(init, str):
        return init_sharded(build, mesh, PARAM_RULES)
    graphdef, params, _, rest = abstract_parts(build, mesh)
    # Laid out as the step expects (a no-op for arrays already there, e.g. restored shards).
    params = jax.device_put(_via_host(init(params), shardings_of(params)), shardings_of(params))

    def others():  # XLA drops the unused parameter initialisers.
        with nnx.use_eager_sharding(False):
            return nnx.split(build(), nnx.Param, ...)[2]

    rest = jax.jit(others, out_shardings=shardings_of(rest))()
    return nnx.merge(graphdef, params, rest)


class _Named:
    """An nnx filter: the variables of the named top-level models of a `Models` bundle."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def __call__(self, path, value) -> bool:
        return bool(path) and path[0] in self.names

    def __repr__(self) -> str:
        return f"models{list(self.names)}"


def _buffers(x: jax.Array) -> tuple[int, ...]:
    """The device buffers of an array (two arrays may share them)."""
    return tuple(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)


def _unshared(module: nnx.Module, frozen: set[tuple[int, ...]]) -> nnx.Module:
    """`module` with a copy of any array whose buffers a frozen model holds too (e.g. a
    student initialised from the very arrays of its teacher): the step donates trained ones."""
    if not frozen:
        return module
    graphdef, state = nnx.split(module)

    def copy(x):
        return jax.device_put(x, x.sharding, may_alias=False) if _buffers(x) in frozen else x

    return nnx.merge(graphdef, jax.tree.map(copy, state))


def _nonempty(state: Any) -> Any:
    return state if jax.tree.leaves(state) else None


class StageDriver:
    """Builds, starts (fresh or resumed) and trains one stage (see the module docstring).

    Args:
      config: schedule, optimiser and mesh.
      models: the stage's models by name, or one `ModelSpec` (the module is then the model
        itself, as the loss sees it and checkpoints store it).
      loss_fn: `(module, batch, rng) -> LossOutput`.
      run_dir: checkpoints, metrics, plots.
      trainable: what trains among the non-frozen models' variables.
      eval_loss_fn: the loss the loss evaluations use (default `loss_fn`; e.g. one that also
        reports acceptance figures).
      batch_keys: the keys of a batch (each `[rows, T]`, rows over the data-parallel axes),
        or a mapping of them to their dtypes (int32 by default).
      checkpoint_root: the model whose parameters checkpoints store at the root of their
        params item (e.g. "policy": then `restore_params` of any checkpoint of the stage is
        that model), when it is the only one that trains.
      run_config / model_config: JSON-serialisable configs saved with every checkpoint.
      derive_metrics: step metrics -> more figures (see `Trainer`).
      mesh: overrides the mesh built from `config.mesh`.
    """

    def __init__(
        self,
        config: StageConfig,
        *,
        models: Mapping[str, ModelSpec] | ModelSpec,
        loss_fn: LossFn,
        run_dir: os.PathLike | str,
        trainable: Filter = nnx.Param,
        eval_loss_fn: LossFn | None = None,
        batch_keys: Sequence[str] | Mapping[str, Any] = BATCH_KEYS,
        checkpoint_root: str | None = None,
        run_config: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
        derive_metrics: Callable[[Mapping[str, float]], Mapping[str, float]] | None = None,
        mesh: jax.sharding.Mesh | None = None,
    ):
        # CPU: freed host memory stays in the process, so steps do not page-fault their
        # buffers back in (`hat_jax.host_memory`; HAT_JAX_RETAIN_HOST_MEMORY=0 turns it off).
        host_memory.retain_freed_memory()
        self.config, self.run_dir = config, pathlib.Path(run_dir)
        self.mesh = mesh or make_mesh(config.mesh)
        tcfg = config.trainer
        self.specs: dict[str, ModelSpec] | ModelSpec = (
            models if isinstance(models, ModelSpec) else dict(models)
        )
        if not isinstance(self.specs, ModelSpec):
            if not self.specs:
                raise ValueError("StageDriver: a stage needs at least one model")
            if all(s.frozen for s in self.specs.values()):
                raise ValueError(f"StageDriver: every model is frozen ({sorted(self.specs)})")
        elif self.specs.frozen:
            raise ValueError("StageDriver: the stage's only model is frozen")
        frozen_names = tuple(n for n, s in self._named() if s.frozen)
        self.frozen_filter = _Named(frozen_names) if frozen_names else nnx.Nothing
        self.trainable = trainable
        self.graphdef, params, frozen, rest = abstract_parts(
            self._build_all, self.mesh, trainable=trainable, frozen=self.frozen_filter
        )
        if not jax.tree.leaves(params):
            raise ValueError("StageDriver: the trainable filter selects no variable")
        self.optimizer = make_optimizer(config.optimizer, params)
        self.abstract = abstract_train_state(
            params, rest, self.optimizer, self.mesh, frozen=_nonempty(frozen)
        )
        self.checkpoint_root = checkpoint_root
        self.checkpoints: CheckpointManager | None = None  # opened by `start`
        self.batch_dtypes = (
            {k: jnp.dtype(v) for k, v in batch_keys.items()}
            if isinstance(batch_keys, Mapping)
            else dict.fromkeys(batch_keys, jnp.dtype(jnp.int32))
        )
        self.batch_keys = tuple(self.batch_dtypes)
        shardings = shardings_of(self.abstract)
        batch_shardings = batch_shardings_for(self.mesh, self.batch_keys)
        self.step_fn = make_train_step(
            loss_fn,
            graphdef=self.graphdef,
            optimizer=self.optimizer,
            state_shardings=shardings,
            batch_shardings=batch_shardings,
            micro_batches=tcfg.micro_batches,
            learning_rate_fn=learning_rate_schedule(config.optimizer),
        )
        self.eval_fn = make_eval_step(
            eval_loss_fn or loss_fn,
            graphdef=self.graphdef,
            state_shardings=shardings,
            batch_shardings=batch_shardings,
        )
        self.run_config, self.model_config = run_config, model_config
        self.derive_metrics = derive_metrics
        self.trainer: Trainer | None = None
        self.restored_step: int | None = None
        self._frozen_modules: dict[str, nnx.Module] | None = None

    # -- models ---------------------------------------------------------------------------------

    def _named(self) -> list[tuple[str | None, ModelSpec]]:
        if isinstance(self.specs, ModelSpec):
            return [(None, self.specs)]
        return list(self.specs.items())

    def _build_all(self) -> nnx.Module:
        if isinstance(self.specs, ModelSpec):
            return self.specs.build()
        return Models(**{name: spec.build() for name, spec in self.specs.items()})

    def frozen_models(self) -> dict[str, nnx.Module]:
        """The frozen models, read from their sources once (e.g. to sample rollouts from)."""
        if self._frozen_modules is None:
            self._frozen_modules = {
                name: build_sharded(spec.build, spec.init, self.mesh)
                for name, spec in self._named()
                if spec.frozen
            }
        return self._frozen_modules

    def initial_state(self) -> TrainState:
        """A fresh train state: every model from its source (the frozen ones shared), as a run
        starts without a checkpoint (e.g. to time `step_fn` alone)."""
        frozen = self.frozen_models()
        shared = {_buffers(x) for x in jax.tree.leaves(nnx.state(Models(**frozen)))}
        built = {
            name: frozen[name]
            if spec.frozen
            else _unshared(build_sharded(spec.build, spec.init, self.mesh), shared)
            for name, spec in self._named()
        }
        module = built[None] if None in built else Models(**built)
        return init_train_state(
            module,
            self.optimizer,
            self.mesh,
            seed=self.config.trainer.seed,
            trainable=self.trainable,
            frozen=self.frozen_filter,
        )[1]

    def _frozen_state(self) -> Any:
        if self.abstract.frozen is None:
            return None
        module = Models(**self.frozen_models())
        return nnx.split(module, self.frozen_filter, ...)[1]

    # -- the run ----------------------------------------------------------------------------------

    def start(
        self, data: DataSource | OnPolicySource, evaluations: Sequence[Evaluation] = ()
    ) -> int | None:
        """Resumes from the newest readable checkpoint (train state, data position, metrics),
        or initialises every model from its source. `evaluations` run every
        `trainer.eval_every` steps and at the last step. Returns the step resumed from, or
        None."""
        tcfg = self.config.trainer
        dp = data_parallel_size(self.mesh)
        if (tcfg.batch_size // tcfg.micro_batches) % dp:
            raise ValueError(
                f"trainer.batch_size {tcfg.batch_size} / micro_batches {tcfg.micro_batches} is "
                f"not divisible by the data-parallel size {dp} of mesh {dict(self.mesh.shape)}"
            )
        self.checkpoints = CheckpointManager(
            self.run_dir / CHECKPOINTS_DIR,
            keep=tcfg.keep_checkpoints,
            async_save=tcfg.async_checkpoints,
            params_root=self.checkpoint_root,
        )
        self.trainer = Trainer(
            step_fn=self.step_fn,
            data=data,
            mesh=self.mesh,
            config=self.config.trainer,
            run_dir=self.run_dir,
            checkpoints=self.checkpoints,
            run_config=self.run_config,
            model_config=self.model_config,
            evaluations=evaluations,
            graphdef=self.graphdef,
            derive_metrics=self.derive_metrics,
        )
        restored = self.trainer.resume(self.abstract, frozen=self._frozen_state())
        if restored is None:
            self.trainer.set_state(self.initial_state())
        self.restored_step = restored.step if restored is not None else None
        return self.restored_step

    @property
    def state(self) -> TrainState:
        return self._started().state

    def model(self, state: TrainState | None = None) -> Any:
        """The stage's module (a `Models` bundle, or the single model) for `state` (default:
        the current one; `driver.abstract` gives it with shape structs). Its arrays are the
        state's: the next train step donates the trained ones."""
        return merge_model(self.graphdef, state if state is not None else self.state)

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        """A global batch as sharded shape structs (e.g. to compile the step ahead of time)."""
        t, shardings = self.config.trainer, batch_shardings_for(self.mesh, self.batch_keys)
        return {k: jax.ShapeDtypeStruct((t.batch_size, t.seq_len), self.batch_dtypes[k],
                                        sharding=shardings[k]) for k in self.batch_keys}  # fmt: skip

    def loss_evaluation(
        self, batches: Callable[[], Any], *, max_batches: int | None = None
    ) -> Evaluation:
        """An evaluation of the eval loss over a fresh iterator of `batches()` each time (at
        most `max_batches` of them; None: all)."""
        return loss_evaluation(self.eval_fn, batches, self.mesh, max_batches=max_batches)

    def evaluate(
        self, evaluations: Sequence[Evaluation], state: TrainState | None = None
    ) -> dict[str, float]:
        """Runs evaluations on `state` (default: the current one), logging nothing."""
        state = state if state is not None else self.state
        out: dict[str, float] = {}
        for evaluation in evaluations:
            out |= dict(evaluation(state))
        return out

    def log_evaluation(self) -> dict[str, float]:
        """Runs the evaluations on the current state and logs them at the current step (e.g.
        step 0 of a fresh run: the figures before any training)."""
        trainer = self._started()
        return trainer.evaluate(trainer.step, trainer.state)

    def _started(self) -> Trainer:
        if self.trainer is None or self.trainer.state is None:
            raise ValueError("StageDriver: call start() first")
        return self.trainer

    def train(self) -> StageResult:
        """Runs the loop to `trainer.total_steps` (or until the data ends or a stop request);
        returns where things are."""
        trainer = self._started()
        try:
            trainer.run()
        finally:
            trainer.close()
        latest = self.checkpoints.latest_step()
        records = [r for r in read_metrics(self.run_dir) if "loss" in r]
        checkpoints = self.run_dir / CHECKPOINTS_DIR
        return StageResult(
            run_dir=self.run_dir,
            step=trainer.step,
            checkpoint_dir=checkpoints / str(latest) if latest is not None else None,
            metrics_path=self.run_dir / METRICS_FILE,
            plots_dir=self.run_dir / "plots",
            final_metrics=records[-1] if records else {},
            resumed_from=self.restored_step,
            preempted=trainer.preempted,
            state=trainer.state,
        )

    def run(
        self, data: DataSource | OnPolicySource, evaluations: Sequence[Evaluation] = ()
    ) -> StageResult:
        """`start(data, evaluations)` then `train()`."""
        self.start(data, evaluations)
        return self.train()


def run_stage(
    config: StageConfig,
    *,
    data: DataSource | OnPolicySource,
    evaluations: Sequence[Evaluation] = (),
    **driver: Any,
) -> StageResult:
    """Runs (or resumes) a stage to the end: `StageDriver(config, **driver).run(data, ...)`."""
    return StageDriver(config, **driver).run(data, evaluations)
