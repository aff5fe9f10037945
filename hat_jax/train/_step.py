"""One pure, jitted train step shared by every stage: `make_train_step(loss_fn)`.

SFT, distillation, GRPO and MTP differ only in `loss_fn` and the batch. A loss function maps
`(model, batch, rng)` to a `LossOutput` of *sums*: `total` (the objective summed over what it
weighs, e.g. tokens), `weight` (that count) and `metrics` (each also a weighted sum). The
objective of a batch is `sum(total) / sum(weight)`, so splitting a batch into micro-batches
and accumulating gradients of the sums, divided once by the total weight at the end, gives
the gradient of the whole batch — token-weighted, exact up to float summation order.

After the gradient: the global norm; a non-finite guard (a non-finite loss or gradient norm
skips the update and counts it, `TrainState.nonfinite_streak` / `nonfinite_total`); the
optimiser update. The state is donated, except its frozen part (`TrainState.frozen`: a
teacher, a reference policy), which is passed to the compiled program apart and returned as
it came, so arrays that other holders (a sampler) share stay valid. Input and output
shardings are explicit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hat_jax.sharding import ACTIVATION_RULES, use_rules
from hat_jax.train._state import TrainState, merge_model


class LossOutput(NamedTuple):
    """What a loss function returns: sums over its batch, normalised by the step.

    Attributes:
      total: scalar, the objective summed over the units it weighs (tokens for SFT).
      weight: scalar, how many units (the normaliser); the batch objective is total / weight.
      metrics: scalars, each a weighted sum reported as sum / weight.
    """

    total: jax.Array
    weight: jax.Array
    metrics: Mapping[str, jax.Array]


def _mesh_of(batch_shardings: Mapping[str, NamedSharding]) -> jax.sharding.Mesh | None:
    meshes = {s.mesh for s in batch_shardings.values()}
    return meshes.pop() if len(meshes) == 1 else None


LossFn = Callable[[nnx.Module, Mapping[str, jax.Array], jax.Array], LossOutput]


def _micro_split(batch: Mapping[str, jax.Array], count: int, shardings) -> dict[str, jax.Array]:
    """[B, ...] -> [count, B / count, ...]; micro-batch k takes rows k, k + count, ...

    Taking strided rows keeps every micro-batch spread evenly over the data-parallel devices
    (each holds contiguous rows), so the split moves no data.
    """
    out = {}
    for key, x in batch.items():
        rows = x.shape[0]
        if rows % count:
            raise ValueError(f"batch '{key}': {rows} rows do not split into {count} micro-batches")
        x = x.reshape(rows // count, count, *x.shape[1:]).swapaxes(0, 1)
        spec = shardings[key].spec if key in shardings else PartitionSpec()
        mesh = shardings[key].mesh if key in shardings else None
        if mesh is not None:
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, *spec)))
        out[key] = x
    return out


def _accumulate(grad_fn, params, batch, rng, count, batch_shardings, params_shardings):
    """Sums of (total, weight, metrics, grads) over `count` micro-batches, in one `lax.scan`."""
    if count == 1:
        (total, out), grads = grad_fn(params, batch, rng)
        return total, out.weight, dict(out.metrics), grads
    micro = _micro_split(batch, count, batch_shardings)
    first = jax.tree.map(lambda x: x[0], micro)
    _, out_shape = jax.eval_shape(grad_fn, params, first, rng)[0]
    zeros = lambda t: jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), t)  # noqa: E731
    grads0 = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if params_shardings is not None:
        grads0 = jax.lax.with_sharding_constraint(grads0, params_shardings)

    def body(carry, xs):
        total_acc, weight_acc, metrics_acc, grads_acc = carry
        mb, k = xs
        (total, out), grads = grad_fn(params, mb, jax.random.fold_in(rng, k))
        grads_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_acc, grads)
        metrics_acc = {name: metrics_acc[name] + v for name, v in out.metrics.items()}
        return (total_acc + total, weight_acc + out.weight, metrics_acc, grads_acc), None

    init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros(dict(out_shape.metrics)))
    carry, _ = jax.lax.scan(body, (*init, grads0), (micro, jnp.arange(count)))
    return carry


def make_train_step(
    loss_fn: LossFn,
    *,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    state_shardings: Any,
    batch_shardings: Mapping[str, NamedSharding],
    micro_batches: int = 1,
    learning_rate_fn: optax.Schedule | None = None,
    donate: bool = True,
) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """A jitted `(state, batch) -> (state, metrics)` for `loss_fn`.

    Args:
      loss_fn: `(model, batch, rng) -> LossOutput` (sums; see the module docstring).
      graphdef: the model's static graph (`split_model(model)[0]`).
      optimizer: the optax transformation whose state is in `TrainState.opt_state`.
      state_shardings: the `TrainState` tree of `NamedSharding`s (in and out).
      batch_shardings: a `NamedSharding` per batch key.
      micro_batches: gradient accumulation: the batch is split into this many micro-batches.
      learning_rate_fn: the schedule, to report the step's learning rate.
      donate: donate the input state's buffers to the output state.

    Returns:
      The compiled step. Metrics: `loss`, `grad_norm`, `weight` (e.g. loss tokens), `skipped`,
      `nonfinite_streak`, `learning_rate` (if given) and each of the loss's metrics / weight.
    """
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    params_shardings = getattr(state_shardings, "params", None)
    mesh = _mesh_of(batch_shardings)

    def step(state: TrainState, batch, frozen):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)

        def objective(params, micro, key):
            with use_rules(ACTIVATION_RULES, mesh):
                model = merge_model(graphdef, state.replace(params=params, frozen=frozen))
                out = loss_fn(model, micro, key)
            return out.total, out

        grad_fn = jax.value_and_grad(objective, has_aux=True)
        total, weight, metrics, grads = _accumulate(
            grad_fn, state.params, batch, rng, micro_batches, batch_shardings, params_shardings
        )
        norm = jnp.maximum(weight, 1e-9)
        grads = jax.tree.map(lambda g: g / norm, grads)
        loss = total / norm
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply(_):
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            new = (optax.apply_updates(state.params, updates), opt_state)
            # float32 gradients must not promote lower-precision parameters or moments
            return jax.tree.map(
                lambda x, old: x.astype(old.dtype), new, (state.params, state.opt_state)
            )

        params, opt_state = jax.lax.cond(
            finite, apply, lambda _: (state.params, state.opt_state), None
        )
        skipped = (~finite).astype(jnp.int32)
        new = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            nonfinite_streak=(state.nonfinite_streak + 1) * skipped,
            nonfinite_total=state.nonfinite_total + skipped,
        )
        out = {name: value / norm for name, value in metrics.items()}
        out |= {"loss": loss, "grad_norm": grad_norm, "weight": weight, "skipped": skipped}
        out["nonfinite_streak"] = new.nonfinite_streak
        out["nonfinite_total"] = new.nonfinite_total
        if learning_rate_fn is not None:
            out["learning_rate"] = learning_rate_fn(state.step)
        return new, out

    return _Compiled(
        step,
        state_shardings,
        dict(batch_shardings),
        out_state=True,
        donate=donate,
    )


def make_eval_step(
    loss_fn: LossFn,
    *,
    graphdef: nnx.GraphDef,
    state_shardings: Any,
    batch_shardings: Mapping[str, NamedSharding],
) -> Callable[[TrainState, Mapping[str, jax.Array]], LossOutput]:
    """A jitted `(state, batch) -> LossOutput` (sums, so batches aggregate exactly)."""

    mesh = _mesh_of(batch_shardings)

    def evaluate(state: TrainState, batch, frozen):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        model = merge_model(graphdef, state.replace(frozen=frozen))
        with use_rules(ACTIVATION_RULES, mesh):
            return loss_fn(model, batch, rng)

    return _Compiled(evaluate, state_shardings, dict(batch_shardings), out_state=False)


class _Compiled:
    """A jitted `(state, batch)` function whose `TrainState.frozen` travels as a separate,
    never-donated argument (and is put back into the returned state as it came)."""

    def __init__(self, fn, state_shardings, batch_shardings, *, out_state: bool, donate=False):
        frozen_shardings = getattr(state_shardings, "frozen", None)
        if state_shardings is not None and hasattr(state_shardings, "replace"):
            state_shardings = state_shardings.replace(frozen=None)
        self._out_state = out_state
        self._jitted = jax.jit(
            fn,
            in_shardings=(state_shardings, batch_shardings, frozen_shardings),
            out_shardings=(state_shardings, None) if out_state else None,
            donate_argnums=(0,) if donate else (),
        )

    def _args(self, state: TrainState, batch):
        return state.replace(frozen=None), batch, state.frozen

    def __call__(self, state: TrainState, batch):
        out = self._jitted(*self._args(state, batch))
        if not self._out_state:
            return out
        new, metrics = out
        return new.replace(frozen=state.frozen), metrics

    def lower(self, state: TrainState, batch):
        """`jax.jit(...).lower` of the program (e.g. for a memory plan)."""
        return self._jitted.lower(*self._args(state, batch))
