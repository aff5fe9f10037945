"""The compiled generation loop: prefill, then `jax.lax.while_loop` over a pytree state.

Everything here is traced once per (model structure, bucketed shapes, strategy, number of
draft tokens); the user API (`models._sampler`) pads requests into those buckets.

Plain decoding feeds the last sampled token each iteration. Self-speculative decoding (with
an `MTPHead`) keeps the invariant: the target's cache holds tokens x_0 .. x_{n-1}, `pending`
is x_n (sampled, not yet fed), and the head's cache holds the pairs (h_t, x_{t+1}) for
t < n - 1, while `DraftState` lists the pairs still to feed. One iteration:

1. the head takes the pending pairs and drafts d_1 (then d_2 .. d_k from its own hidden);
2. the target verifies [x_n, d_1 .. d_k] in one cached call;
3. exact acceptance keeps a drafts and draws one more token c (`speculative_accept`);
4. the target's cache is rewound to x_n, d_1 .. d_a and the head's to its last exact pair;
   the pairs (G_0, d_1) .. (G_a, c), G the target's hidden states of the block, are pending.

Sharding: every array of the loop state is batch-major, and `_pin` constrains it by logical
names (`batch` first; the caches by `cache_logical_axes`) where it is created — each empty or
tiled cache, the state after prefill — and at the end of every step, so the while loop's
carry keeps the layout. Under `hat_jax.sharding.use_rules(SAMPLING_RULES, mesh)` (the
`Sampler` on sharded weights) the rows, and with them the caches, are split over the data-like
mesh axes and never gathered; without a mesh every constraint is a no-op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from hat_jax.sharding import constrain
from models._cache import Cache, constrain_cache
from models._sampling import (
    SamplingArrays,
    Strategy,
    sample,
    speculative_accept,
    token_logprob,
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Buffers:
    """Generated tokens per row (`G` slots) and their bookkeeping."""

    tokens: jax.Array  # int32[B, G]
    logprobs: jax.Array  # f32[B, G] under the sampling distribution
    policy_logprobs: jax.Array  # f32[B, G] under the unmodified policy
    length: jax.Array  # int32[B]
    done: jax.Array  # bool[B]
    stopped: jax.Array  # bool[B]: ended on a stop token


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftState:
    """The draft head's cache and the (hidden, token) pairs it has not seen yet."""

    hidden: jax.Array  # [B, k + 1, H]
    ids: jax.Array  # int32[B, k + 1]
    count: jax.Array  # int32[B] pending pairs (a prefix of the k + 1)
    cache: Cache
    accepted: jax.Array  # int32[] drafts accepted so far (rows still generating)
    verified: jax.Array  # int32[] verification steps so far (rows still generating)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoopState:
    out: Buffers
    pending: jax.Array  # int32[B] the last emitted token, not yet fed to the target
    cache: Cache
    key: jax.Array
    steps: jax.Array  # int32[] loop iterations
    draft: DraftState | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Request:
    """The per-call arrays of one bucketed generation request."""

    prompt_ids: jax.Array  # int32[B, P], right-padded
    prompt_lengths: jax.Array  # int32[B], >= 1
    max_lengths: jax.Array  # int32[B], 1 <= max_lengths <= G
    stop_tokens: jax.Array  # int32[S], -1 = unused
    params: SamplingArrays


def _rows(x: jax.Array) -> jax.Array:
    """x pinned batch-major: its leading axis over the batch axes, the rest whole."""
    return constrain(x, ("batch",) + (None,) * (x.ndim - 1))


def _pin(state: LoopState) -> LoopState:
    """The loop state with every per-row array constrained batch-major (see the module
    docstring): the caches by their logical axes, the rest by their leading axis."""
    draft = state.draft
    if draft is not None:
        draft = dataclasses.replace(
            draft,
            hidden=_rows(draft.hidden),
            ids=_rows(draft.ids),
            count=_rows(draft.count),
            cache=constrain_cache(draft.cache),
        )
    return dataclasses.replace(
        state,
        out=jax.tree.map(_rows, state.out),
        pending=_rows(state.pending),
        cache=constrain_cache(state.cache),
        draft=draft,
    )


def _emit(out: Buffers, tokens, logprobs, policy_logprobs, count, req: Request) -> Buffers:
    """Appends up to `count[b]` of tokens [B, m] to each unfinished row, cut after a stop
    token and at the row's length limit."""
    m = tokens.shape[1]
    index = jnp.arange(m)[None, :]
    is_stop = jnp.any(tokens[..., None] == req.stop_tokens[None, None, :], axis=-1)
    is_stop &= index < count[:, None]
    first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, m + 1)
    n = jnp.minimum(jnp.minimum(count, first_stop), req.max_lengths - out.length)
    n = jnp.where(out.done, 0, n)
    size = out.tokens.shape[1]
    slots = jnp.where(index < n[:, None], out.length[:, None] + index, size)  # size: dropped
    rows = jnp.arange(tokens.shape[0])[:, None]

    def put(buffer, values):
        return buffer.at[rows, slots].set(values.astype(buffer.dtype), mode="drop")

    length = out.length + n
    stopped = out.stopped | ((first_stop <= n) & ~out.done)
    return Buffers(
        tokens=put(out.tokens, tokens),
        logprobs=put(out.logprobs, logprobs),
        policy_logprobs=put(out.policy_logprobs, policy_logprobs),
        length=length,
        done=out.done | stopped | (length >= req.max_lengths),
        stopped=stopped,
    )


def _scores(logp, logits, tokens):
    """(log-prob of tokens under the sampling log-probs `logp`, under the raw policy)."""
    raw = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return token_logprob(logp, tokens), token_logprob(raw, tokens)


def _gather_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[b, index[b]] for x [B, T, ...]."""
    return x[jnp.arange(x.shape[0]), index]


def prefill(target, req: Request, cache: Cache, key, strategy: Strategy, gen_slots: int):
    """Runs the prompts, samples the first token; returns (state, target output)."""
    batch, length = req.prompt_ids.shape
    segment_ids = (jnp.arange(length)[None, :] < req.prompt_lengths[:, None]).astype(jnp.int32)
    out = target(req.prompt_ids, segment_ids=segment_ids, cache=cache)
    last_hidden = _gather_rows(out.hidden, req.prompt_lengths - 1)
    logits = target._unembed(last_hidden)  # only the last position's logits are computed
    key, sub = jax.random.split(key)
    logp = strategy(logits, req.params)
    token = sample(sub, logp)
    lp, plp = _scores(logp, logits, token)
    empty = Buffers(
        tokens=jnp.zeros((batch, gen_slots), jnp.int32),
        logprobs=jnp.zeros((batch, gen_slots), jnp.float32),
        policy_logprobs=jnp.zeros((batch, gen_slots), jnp.float32),
        length=jnp.zeros((batch,), jnp.int32),
        done=jnp.zeros((batch,), bool),
        stopped=jnp.zeros((batch,), bool),
    )
    ones = jnp.ones((batch,), jnp.int32)
    buffers = _emit(empty, token[:, None], lp[:, None], plp[:, None], ones, req)
    state = LoopState(
        out=buffers, pending=token, cache=out.cache, key=key, steps=jnp.zeros((), jnp.int32)
    )
    return _pin(state), out


def plain_step(target, req: Request, strategy: Strategy, state: LoopState) -> LoopState:
    """Feeds the pending token and samples the next one."""
    out = target(state.pending[:, None], cache=state.cache)
    key, sub = jax.random.split(state.key)
    logits = out.logits[:, 0]
    logp = strategy(logits, req.params)
    token = sample(sub, logp)
    lp, plp = _scores(logp, logits, token)
    ones = jnp.ones_like(token)
    buffers = _emit(state.out, token[:, None], lp[:, None], plp[:, None], ones, req)
    return _pin(
        dataclasses.replace(
            state, out=buffers, pending=token, cache=out.cache, key=key, steps=state.steps + 1
        )
    )


def draft_prefill(
    head,
    target,
    req: Request,
    target_out,
    state: LoopState,
    cache: Cache,
    k,
    prefix_last: jax.Array | None = None,
):
    """Feeds the prompt's pairs (h_t, x_{t+1}), t < n - 1, to the head; the last pair
    (h_{n-1}, first sampled token) waits in the `DraftState`.

    With a shared prefix (`cache` then holds the prefix's pairs and `prefix_last` [1, H] is
    the target's hidden state at the prefix's last token), `req` holds each row's own tokens
    x_P .. x_{n-1}: their pairs are (h_{P-1}, x_P), (h_P, x_{P+1}), ..."""
    batch, length = req.prompt_ids.shape
    if prefix_last is None:
        hidden = target_out.hidden
        next_ids = jnp.concatenate(
            [req.prompt_ids[:, 1:], jnp.zeros((batch, 1), req.prompt_ids.dtype)], axis=1
        )
        pairs = jnp.arange(length)[None, :] < req.prompt_lengths[:, None] - 1
    else:
        first = jnp.broadcast_to(prefix_last[:, None], (batch, 1, prefix_last.shape[-1]))
        hidden = jnp.concatenate([first.astype(target_out.hidden.dtype),
                                  target_out.hidden[:, :-1]], axis=1)  # fmt: skip
        next_ids = req.prompt_ids
        pairs = jnp.arange(length)[None, :] < req.prompt_lengths[:, None]
    segment_ids = pairs.astype(jnp.int32)
    mtp = head(hidden, next_ids, target, segment_ids=segment_ids, cache=cache)
    last = jnp.zeros((batch, k + 1, target_out.hidden.shape[-1]), target_out.hidden.dtype)
    last = last.at[:, 0].set(_gather_rows(target_out.hidden, req.prompt_lengths - 1))
    ids = jnp.zeros((batch, k + 1), jnp.int32).at[:, 0].set(state.pending)
    zero = jnp.zeros((), jnp.int32)
    draft = DraftState(
        hidden=last,
        ids=ids,
        count=jnp.ones((batch,), jnp.int32),
        cache=mtp.cache,
        accepted=zero,
        verified=zero,
    )
    return _pin(dataclasses.replace(state, draft=draft))


def _draft(head, target, req, strategy, draft: DraftState, keys, k):
    """Drafts k tokens: (tokens int[B, k], their distributions [B, k, V], head cache)."""
    valid = (jnp.arange(k + 1)[None, :] < draft.count[:, None]).astype(jnp.int32)
    out = head(draft.hidden, draft.ids, target, segment_ids=valid, cache=draft.cache)
    logits = _gather_rows(out.logits, draft.count - 1)
    hidden = _gather_rows(out.hidden, draft.count - 1)
    cache = out.cache
    tokens, logps = [], []
    for j in range(k):
        if j:
            out = head(hidden[:, None], tokens[-1][:, None], target, cache=cache)
            logits, hidden, cache = out.logits[:, 0], out.hidden[:, 0], out.cache
        logp = strategy(logits, req.params)
        tokens.append(sample(keys[j], logp))
        logps.append(logp)
    return jnp.stack(tokens, 1), jnp.stack(logps, 1), cache


def speculative_step(head, target, req, strategy, k: int, state: LoopState) -> LoopState:
    """One draft-verify-accept iteration (see the module docstring)."""
    key, sub_accept, *draft_keys = jax.random.split(state.key, k + 2)
    drafts, draft_logp, head_cache = _draft(head, target, req, strategy, state.draft, draft_keys, k)
    block = jnp.concatenate([state.pending[:, None], drafts], axis=1)  # [B, k + 1]
    out = target(block, cache=state.cache)
    target_logp = strategy(out.logits, req.params)
    accepted, token = speculative_accept(sub_accept, target_logp, draft_logp, drafts)
    rows = jnp.arange(block.shape[0])
    emitted = jnp.concatenate([drafts, drafts[:, :1]], axis=1).at[rows, accepted].set(token)
    lp, plp = _scores(target_logp, out.logits, emitted)
    live = ~state.out.done
    buffers = _emit(state.out, emitted, lp, plp, accepted + 1, req)
    draft = DraftState(
        hidden=out.hidden,
        ids=emitted,
        count=accepted + 1,
        cache=head_cache.rewind(jnp.full_like(accepted, k - 1)),
        accepted=state.draft.accepted + jnp.sum(jnp.where(live, accepted, 0)),
        verified=state.draft.verified + jnp.sum(live.astype(jnp.int32)),
    )
    return _pin(
        LoopState(
            out=buffers,
            pending=token,
            cache=out.cache.rewind(k - accepted),
            key=key,
            steps=state.steps + 1,
            draft=draft,
        )
    )


def _tile(tree, batch: int):
    """A cache of one row given to each of `batch` rows (layer caches are [repeats, B, ...];
    `end` is [B])."""

    def tile(x):
        axis = 0 if x.ndim == 1 else 1
        if x.shape[axis] != 1:
            raise AssertionError(f"prefix cache leaf {x.shape} has no batch axis of 1 at {axis}")
        return jnp.repeat(x, batch, axis=axis)

    return constrain_cache(jax.tree.map(tile, tree))


def shared_prefix_cache(
    target, prefix: jax.Array, batch: int, slots: int, rollback: int = 0
) -> tuple[Cache, jax.Array]:
    """The cache after `prefix` [1, P] (the same leading tokens of every row), computed once
    and given to each of `batch` rows, and the target's hidden states [1, P, H] there."""
    out = target(prefix, cache=target.init_cache(1, slots, rollback=rollback))
    return _tile(out.cache, batch), out.hidden


def draft_prefix_cache(head, target, prefix, hidden, batch: int, slots: int) -> Cache:
    """The head's cache after the prefix's pairs (h_t, x_{t+1}), t < P - 1, computed once and
    given to each of `batch` rows."""
    cache = head.init_cache(1, slots)
    if prefix.shape[1] > 1:
        cache = head(hidden[:, :-1], prefix[:, 1:], target, cache=cache).cache
    return _tile(cache, batch)


def generate(
    graphs: tuple[nnx.GraphDef, nnx.GraphDef, nnx.GraphDef | None],
    states: tuple[nnx.State, nnx.State | None],
    req: Request,
    key: jax.Array,
    prefix: jax.Array | None = None,
    *,
    strategy: Strategy,
    gen_slots: int,
    num_draft_tokens: int,
    on_trace: Callable[[], None] = lambda: None,
) -> LoopState:
    """Prefill and the decoding loop, to be wrapped in `jax.jit` (all keywords static).

    `graphs` are the target's graph for prefill and for decoding (they may differ in runtime
    choices such as the MoE dispatch) and the head's (None without speculation); `states`
    the target's and the head's parameters. `prefix` [1, P]: leading tokens every row shares,
    prefilled once (`req` then holds each row's remaining tokens); with speculation the
    head's cache of the prefix's pairs is computed once too.
    """
    on_trace()
    prefill_graph, decode_graph, head_graph = graphs
    target_state, head_state = states
    k = num_draft_tokens
    batch, length = req.prompt_ids.shape
    shared = 0 if prefix is None else prefix.shape[1]
    slots = shared + length + gen_slots + k + 1
    target = nnx.merge(prefill_graph, target_state)
    if shared:
        cache, prefix_hidden = shared_prefix_cache(target, prefix, batch, slots, rollback=k)
    else:
        cache = constrain_cache(target.init_cache(batch, slots, rollback=k))
    state, out = prefill(target, req, cache, key, strategy, gen_slots)
    target = nnx.merge(decode_graph, target_state)
    if k:
        head = nnx.merge(head_graph, head_state)
        if shared:
            head_cache = draft_prefix_cache(head, target, prefix, prefix_hidden, batch, slots)
            state = draft_prefill(head, target, req, out, state, head_cache, k,
                                  prefix_last=prefix_hidden[:, -1])  # fmt: skip
        else:
            head_cache = constrain_cache(head.init_cache(batch, slots))
            state = draft_prefill(head, target, req, out, state, head_cache, k)

        def step(s):
            return speculative_step(head, target, req, strategy, k, s)
    else:

        def step(s):
            return plain_step(target, req, strategy, s)

    def cond(s):
        return ~jnp.all(s.out.done) & (s.steps < gen_slots)

    return jax.lax.while_loop(cond, step, state)
