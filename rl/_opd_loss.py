"""The General-OPD loss: the reverse KL of the student to its teacher on the student's own
tokens, exact over the full vocabulary or by the sampled-token estimator, as the sums of
`hat_jax.train.LossOutput` (see `rl.distill` for the per-position math)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from hat_jax.train import LossOutput, next_token_targets, unembedding
from rl.distill import token_reverse_kl

ESTIMATORS = ("exact", "sampled")


def _kl_sums(student_logits, teacher_logits, targets, weights, estimator: str):
    """`(Σ w·KL, Σ w·objective)` over positions: the exact reverse KL of the next-token
    distributions, and the estimator's surrogate (the KL itself, or the sampled-token
    score-function surrogate: value log π_S − log π_T, gradient −A ∇log π_S(y))."""
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    kl = token_reverse_kl(student_logits, teacher_logits)
    kl_sum = jnp.sum(kl * weights)
    if estimator == "exact":
        return kl_sum, kl_sum
    pick = lambda logits: jnp.take_along_axis(  # noqa: E731
        jax.nn.log_softmax(logits.astype(jnp.float32), -1), targets[..., None], -1
    )[..., 0]
    logp_s, logp_t = pick(student_logits), pick(teacher_logits)
    advantage = jax.lax.stop_gradient(logp_t - logp_s)
    surrogate = -advantage - advantage * (logp_s - jax.lax.stop_gradient(logp_s))
    return kl_sum, jnp.sum(surrogate * weights)


def _chunked_kl_sums(h_s, head_s, h_t, head_t, targets, weights, *, chunk: int, estimator: str):
    """`_kl_sums` from final hidden states, `chunk` positions at a time, each chunk's logits
    recomputed in the backward pass (no `[B, T, V]` logits of either model)."""
    b, t, _ = h_s.shape
    n = -(-t // chunk)
    pad = n * chunk - t
    pad_t = lambda x: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
    split = lambda x: jnp.moveaxis(pad_t(x).reshape(b, n, chunk, *x.shape[2:]), 1, 0)  # noqa: E731

    @jax.checkpoint
    def body(carry, xs):
        hs, ht, tgt, w = xs
        logits_s = hs.astype(head_s.dtype) @ head_s
        logits_t = ht.astype(head_t.dtype) @ head_t
        kl, objective = _kl_sums(logits_s, logits_t, tgt, w, estimator)
        return (carry[0] + kl, carry[1] + objective), None

    zero = jnp.zeros((), jnp.float32)
    xs = (split(h_s), split(h_t), split(targets), split(weights))
    (kl, objective), _ = jax.lax.scan(body, (zero, zero), xs)
    return kl, objective


def opd_loss(
    model: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    *,
    estimator: str = "exact",
    logits_chunk: int = 0,
    aux_loss_coef: float = 0.0,
) -> LossOutput:
    """The reverse KL of the student to the teacher on the student's own tokens, as sums.

    Args:
      model: the stage's models: `model.policy` (the student, differentiated) and
        `model.teacher` (frozen), each called as `m(input_ids, positions=, segment_ids=)`.
      batch: prompt + response rows: `input_ids`, `loss_mask` (1 on tokens the student
        sampled), `segment_ids`, `positions`. Position t counts iff token t + 1 was sampled.
      rng: unused (the samples are in the batch).
      estimator: "exact" or "sampled" (see `OPDConfig`).
      logits_chunk: > 0: logits from hidden states this many positions at a time.
      aux_loss_coef: weight of the student's MoE aux loss.

    Returns sums (see `LossOutput`): total = the estimator's objective (+ aux), weight = the
    sampled tokens; metrics `kl` (the exact per-token reverse KL, whatever the estimator)
    and `aux_loss`.
    """
    del rng
    ids, pos, seg = batch["input_ids"], batch["positions"], batch["segment_ids"]
    student = model.policy(ids, positions=pos, segment_ids=seg)
    teacher = model.teacher(ids, positions=pos, segment_ids=seg)
    targets, weights = next_token_targets(batch)
    weights = weights.astype(jnp.float32)
    tokens = jnp.sum(weights)
    if logits_chunk > 0:
        hidden_t = jax.lax.stop_gradient(teacher.hidden)
        kl, objective = _chunked_kl_sums(
            student.hidden[:, :-1], unembedding(model.policy), hidden_t[:, :-1],
            jax.lax.stop_gradient(unembedding(model.teacher)), targets, weights,
            chunk=logits_chunk, estimator=estimator,
        )  # fmt: skip
    else:
        kl, objective = _kl_sums(
            student.logits[:, :-1], teacher.logits[:, :-1], targets, weights, estimator
        )
    aux = jnp.asarray(student.aux_loss if student.aux_loss is not None else 0.0, jnp.float32)
    return LossOutput(
        total=objective + aux_loss_coef * aux * tokens,
        weight=tokens,
        metrics={"kl": kl, "aux_loss": aux * tokens},
    )


def per_response(metrics: Mapping[str, float]) -> dict[str, float]:
    """Step figures derived on the host: the KL per response (Σ KL over the step's sampled
    tokens / its responses)."""
    if metrics.get("responses"):
        return {"kl_per_response": metrics["kl"] * metrics["weight"] / metrics["responses"]}
    return {}
