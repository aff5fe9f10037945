"""Sampling strategies: logits -> the distribution tokens are drawn from, and exact
speculative acceptance.

A strategy turns logits into normalised log-probabilities of the *sampling* distribution
(`-inf` outside its support); tokens are drawn from it with `jax.random.categorical`, and the
same distribution scores them. Greedy decoding is the one-hot distribution on the argmax, so
greedy, temperature, top-k and top-p share one code path and speculative decoding needs no
special case. Settings are per row (arrays), so changing them never recompiles; whether
top-k / top-p filtering runs at all (a full-vocabulary sort) is static.

Speculative acceptance (Leviathan et al., 2023; Chen et al., 2023): draft token d ~ q is
accepted with probability min(1, p(d) / q(d)); at the first rejection the emitted token is
drawn from norm(max(0, p - q)); if all k drafts pass, a bonus token is drawn from p at the
next position. The emitted tokens are distributed exactly as sampling from p one at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to sample one request.

    Attributes:
        temperature: softmax temperature; 0 means greedy (argmax).
        top_k: keep the k most likely tokens (0: no limit).
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1: all).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"Sampling.temperature={self.temperature!r} must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"Sampling.top_k={self.top_k!r} must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"Sampling.top_p={self.top_p!r} must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling(temperature=0.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingArrays:
    """Per-row settings inside compiled code: temperature f32[B], top_k i32[B], top_p f32[B]."""

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def from_rows(cls, rows: list[Sampling]) -> SamplingArrays:
        return cls(
            temperature=jnp.asarray([s.temperature for s in rows], jnp.float32),
            top_k=jnp.asarray([s.top_k for s in rows], jnp.int32),
            top_p=jnp.asarray([s.top_p for s in rows], jnp.float32),
        )


class Strategy(Protocol):
    """Logits f32[B, ..., V] and per-row settings -> log-probs of the sampling distribution.

    Must be hashable (it is a static argument of the compiled sampler) and return normalised
    log-probabilities (`-inf` where a token cannot be drawn).
    """

    def __call__(self, logits: jax.Array, params: SamplingArrays) -> jax.Array: ...


def _per_row(x: jax.Array, ndim: int) -> jax.Array:
    return x.reshape(x.shape + (1,) * (ndim - 1))


@dataclasses.dataclass(frozen=True)
class Standard:
    """Temperature (0 = greedy), then top-k, then top-p, per row.

    Attributes:
        top_k, top_p: whether the filters run at all (each costs a sort of the vocabulary).
    """

    top_k: bool = False
    top_p: bool = False

    def __call__(self, logits: jax.Array, params: SamplingArrays) -> jax.Array:
        logits = logits.astype(jnp.float32)
        t = _per_row(params.temperature, logits.ndim)
        scaled = logits / jnp.where(t > 0, t, 1.0)
        if self.top_k or self.top_p:
            scaled = self._filter(scaled, params)
        logp = jax.nn.log_softmax(scaled, axis=-1)
        one_hot = jnp.arange(logits.shape[-1]) == jnp.argmax(logits, axis=-1)[..., None]
        greedy = jnp.where(one_hot, 0.0, -jnp.inf)
        return jnp.where(t > 0, logp, greedy)

    def _filter(self, scaled: jax.Array, params: SamplingArrays) -> jax.Array:
        ordered = -jnp.sort(-scaled, axis=-1)  # descending
        if self.top_k:
            k = _per_row(params.top_k, scaled.ndim)
            kth = jnp.take_along_axis(ordered, jnp.clip(k - 1, 0, scaled.shape[-1] - 1), -1)
            cut = jnp.where(k > 0, kth, -jnp.inf)
            scaled = jnp.where(scaled < cut, -jnp.inf, scaled)
            ordered = jnp.where(ordered < cut, -jnp.inf, ordered)
        if self.top_p:
            p = _per_row(params.top_p, scaled.ndim)
            probs = jax.nn.softmax(ordered, axis=-1)
            before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
            kept = jnp.sum(before < p, axis=-1, keepdims=True)  # >= 1
            threshold = jnp.take_along_axis(ordered, kept - 1, axis=-1)
            scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
        return scaled


def strategy_for(rows: list[Sampling]) -> Standard:
    """The cheapest `Standard` strategy that serves every row's settings."""
    return Standard(
        top_k=any(s.top_k > 0 and not s.greedy for s in rows),
        top_p=any(s.top_p < 1.0 and not s.greedy for s in rows),
    )


def sample(key: jax.Array, logp: jax.Array) -> jax.Array:
    """Draws from log-probs [..., V] (one-hot log-probs give their token deterministically)."""
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)


def token_logprob(logp: jax.Array, tokens: jax.Array) -> jax.Array:
    """logp[..., tokens] for logp [..., V] and tokens [...]."""
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def speculative_accept(
    key: jax.Array, target_logp: jax.Array, draft_logp: jax.Array, drafts: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Exact acceptance of k draft tokens against the target, per row.

    Args:
        key: PRNG key.
        target_logp: f32[B, k + 1, V] the target's sampling log-probs at the k draft
            positions and the one after them.
        draft_logp: f32[B, k, V] the draft distributions the drafts were drawn from.
        drafts: int[B, k] the draft tokens.

    Returns:
        (accepted int[B] in [0, k], the token emitted after the accepted drafts int[B]).
    """
    k = drafts.shape[1]
    key_accept, key_next = jax.random.split(key)
    p = token_logprob(target_logp[:, :k], drafts)
    q = token_logprob(draft_logp, drafts)
    u = jax.random.uniform(key_accept, drafts.shape)
    # u < p / q, written so that p = 0 never accepts and p = q = 1 (greedy match) always does.
    ok = jnp.log(u) + q < p
    accepted = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    rows = jnp.arange(drafts.shape[0])
    target_next = target_logp[rows, accepted]  # [B, V]
    draft_at = draft_logp[rows, jnp.minimum(accepted, k - 1)]
    residual = jnp.maximum(jnp.exp(target_next) - jnp.exp(draft_at), 0.0)
    total = jnp.sum(residual, axis=-1, keepdims=True)
    rejected = (accepted < k)[:, None] & (total > 0)
    log_residual = jnp.log(residual / jnp.where(total > 0, total, 1.0))
    next_logp = jnp.where(rejected, log_residual, target_next)
    return accepted, sample(key_next, next_logp)
