"""AdamW with linear warmup and cosine decay, global-norm clipping and a weight-decay mask.

Weight decay applies to matrices only: never to norms, biases, DeltaNet's `A_log`/`dt_bias`
or other vectors (a parameter whose shape, without a stacked `layers` axis, has fewer than two
dimensions), and to the token embedding only when `decay_embeddings` is set.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import jax
import optax
from flax import nnx

from hat_jax.sharding import logical_names


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW and its learning-rate schedule.

    Attributes:
      learning_rate: peak learning rate, reached at the end of warmup.
      warmup_steps: linear warmup from 0.
      decay_steps: steps of the whole schedule (warmup included); cosine decay after warmup.
      min_learning_rate_ratio: the final learning rate as a fraction of the peak.
      b1, b2, eps: Adam moments.
      weight_decay: decoupled weight decay on masked-in parameters.
      max_grad_norm: clip gradients to this global norm (0 turns clipping off).
      decay_embeddings: also decay the token embedding.
      no_decay_pattern: regex on the parameter path; matches are never decayed.
    """

    learning_rate: float = 1e-5
    warmup_steps: int = 0
    decay_steps: int = 1000
    min_learning_rate_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    decay_embeddings: bool = False
    no_decay_pattern: str = r"(^|/)[^/]*(norm|bias|A_log|scale)[^/]*$"

    def __post_init__(self):
        if self.learning_rate <= 0:
            raise ValueError(f"OptimizerConfig.learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.warmup_steps <= self.decay_steps:
            raise ValueError(
                "OptimizerConfig: need 0 <= warmup_steps <= decay_steps, got "
                f"warmup_steps={self.warmup_steps}, decay_steps={self.decay_steps}"
            )
        if not 0 <= self.min_learning_rate_ratio <= 1:
            raise ValueError(
                "OptimizerConfig.min_learning_rate_ratio must be in [0, 1], got "
                f"{self.min_learning_rate_ratio}"
            )
        if self.max_grad_norm < 0 or self.weight_decay < 0:
            raise ValueError("OptimizerConfig: max_grad_norm and weight_decay must be >= 0")
        re.compile(self.no_decay_pattern)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> OptimizerConfig:
        return _from_dict(cls, values)


def _from_dict(cls, values: Mapping[str, Any]):
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown}; known: {sorted(fields)}")
    return cls(**dict(values))


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then cosine decay to `min_learning_rate_ratio`."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=max(config.decay_steps, 1),
        end_value=config.learning_rate * config.min_learning_rate_ratio,
    )


def _path(path) -> str:
    keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
    return "/".join(k for k in keys if k != "value")


def weight_decay_mask(params: Any, config: OptimizerConfig) -> Any:
    """A tree of booleans over `params`: True where weight decay applies."""
    pattern = re.compile(config.no_decay_pattern)
    embedding = re.compile(r"(^|/)[^/]*embed[^/]*$")

    def decide(path, variable):
        name = _path(path)
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        names = logical_names(variable) if isinstance(variable, nnx.Variable) else None
        ndim = len(value.shape) - (1 if names and names[0] == "layers" else 0)
        decay = ndim >= 2 and not pattern.search(name)
        if embedding.search(name) and not config.decay_embeddings:
            decay = False
        return variable.replace(decay) if isinstance(variable, nnx.Variable) else decay

    return jax.tree_util.tree_map_with_path(
        decide, params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )


def make_optimizer(config: OptimizerConfig, params: Any) -> optax.GradientTransformation:
    """The AdamW chain for `params` (used for the weight-decay mask's structure)."""
    mask = weight_decay_mask(params, config)
    chain = []
    if config.max_grad_norm > 0:
        chain.append(optax.clip_by_global_norm(config.max_grad_norm))
    chain.append(
        optax.adamw(
            learning_rate_schedule(config),
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=config.weight_decay,
            mask=mask,
        )
    )
    return optax.chain(*chain)
