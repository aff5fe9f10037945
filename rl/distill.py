"""Distillation math of General OPD: on-policy reverse KL of the student to its teacher.

General OPD (paper §3.4). After HSA-SFT the student π_S samples replies to general
instructions and is pulled back toward the pre-SFT base model π_T by the per-token reverse KL
on its *own* tokens, ``KL(π_S ‖ π_T) = Σ_v π_S(v) (log π_S(v) − log π_T(v))`` at every
student-generated position. Student and teacher share a vocabulary, so the exact
full-vocabulary KL (`reverse_kl`) is affordable and has lower variance than the sampled-token
estimator; the sampled form (`opd_token_advantages`, `sampled_reverse_kl_loss`) uses only the
sampled token, ``advantage_t = −(log π_S − log π_T)(y_t)``, as a per-token policy-gradient
reward. The teacher is never differentiated.

All logits are upcast to f32. Every function is wrapped in ``jax.jit`` (mode strings static)
and nests inside a caller's jitted step. Loss aggregation follows `rl.losses.aggregate_loss`.
The MTP draft head's loss and acceptance math is `rl.mtp`'s.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rl.losses import aggregate_loss, check_mask, logits_pair

_sg = jax.lax.stop_gradient


@jax.jit
def token_reverse_kl(student_logits, teacher_logits) -> jax.Array:
    """Exact per-position ``KL(π_S ‖ π_T)`` over the full vocabulary.

    Computed from ``log_softmax`` of both sides (no exp of raw logits, so no overflow); the
    teacher is wrapped in ``stop_gradient``. Vocabulary entries where the student has zero
    probability contribute 0 even if the teacher's log-prob there is −inf (e.g. both mask the
    same padded vocabulary slots with −inf logits).

    Args:
      student_logits: f32[..., V] (bf16 is upcast).
      teacher_logits: f32[..., V] over the same vocabulary.

    Returns:
      f32[...] per-position KL, >= 0.
    """
    s, t = logits_pair(student_logits, teacher_logits)
    logp_s = jax.nn.log_softmax(s, axis=-1)
    logp_t = jax.nn.log_softmax(_sg(t), axis=-1)
    p_s = jnp.exp(logp_s)
    support = p_s > 0
    diff = jnp.where(support, logp_s, 0.0) - jnp.where(support, logp_t, 0.0)
    return jnp.sum(jnp.where(support, p_s * diff, 0.0), axis=-1)


@functools.partial(jax.jit, static_argnames="aggregation")
def reverse_kl(student_logits, teacher_logits, mask, *, aggregation="token-mean") -> jax.Array:
    """General OPD loss: masked mean of the exact full-vocabulary reverse KL.

    Args:
      student_logits: f32[N, T, V] student logits at its own sampled positions.
      teacher_logits: f32[N, T, V] teacher (pre-SFT base) logits at the same positions.
      mask: f32[N, T] 1 on student-generated tokens.
      aggregation: one of `rl.losses.AGGREGATIONS`.

    Returns:
      f32[] loss; its gradient w.r.t. the student logits is the exact ∇KL.
    """
    kl = token_reverse_kl(student_logits, teacher_logits)
    return aggregate_loss(kl, check_mask(mask, kl.shape), aggregation)


@jax.jit
def opd_token_advantages(student_logp, teacher_logp, mask) -> jax.Array:
    """Sampled-token OPD advantages ``A_t = −(log π_S(y_t) − log π_T(y_t))``.

    The per-token reward of on-policy distillation: positive where the teacher likes the
    student's token more than the student does. Its expectation under π_S is −KL(π_S ‖ π_T).

    Args:
      student_logp: f32[N, T] log π_S of the sampled tokens.
      teacher_logp: f32[N, T] log π_T of the same tokens.
      mask: f32[N, T] 1 on student-generated tokens.

    Returns:
      f32[N, T] advantages (stop-gradient), 0 where masked; usable as per-token advantages in
      `rl.losses.ppo_clip_loss` or `rl.losses.gspo_loss`.
    """
    s = jnp.asarray(student_logp, jnp.float32)
    t = jnp.asarray(teacher_logp, jnp.float32)
    if s.shape != t.shape:
        raise ValueError(f"student_logp and teacher_logp differ in shape: {s.shape} vs {t.shape}")
    on = check_mask(mask, s.shape) > 0
    return _sg(jnp.where(on, t - s, 0.0))


@functools.partial(jax.jit, static_argnames="aggregation")
def sampled_reverse_kl_loss(student_logp, teacher_logp, mask, *, aggregation="token-mean"):
    """Sampled-token reverse-KL loss for on-policy samples (ratio 1).

    Value: the aggregated k1 estimate ``log π_S − log π_T`` of the KL. Gradient: the
    score-function estimator ``−A_t ∇ log π_S(y_t)`` with ``A_t`` from `opd_token_advantages`;
    its expectation over y_t ~ π_S is the exact ∇KL(π_S ‖ π_T).

    Args:
      student_logp: f32[N, T] log π_S of the sampled tokens (differentiated).
      teacher_logp: f32[N, T] log π_T of the same tokens.
      mask: f32[N, T] 1 on student-generated tokens.
      aggregation: one of `rl.losses.AGGREGATIONS`.

    Returns:
      f32[] loss.
    """
    adv = opd_token_advantages(student_logp, teacher_logp, mask)
    logp = jnp.where(jnp.asarray(mask) > 0, jnp.asarray(student_logp, jnp.float32), 0.0)
    surrogate = -adv + (-adv) * (logp - _sg(logp))  # value −A, gradient −A ∇logπ_S
    return aggregate_loss(surrogate, mask, aggregation)
