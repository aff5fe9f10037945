"""`SlotDecoder`: step-wise decoding over a fixed number of slots (continuous batching).

    decoder = SlotDecoder(model, slots=8, max_length=4096, stop_tokens=[eos])
    first = decoder.admit(0, prompt_ids, max_new_tokens=256, sampling=Sampling(), seed=7)
    while decoder.active.any():
        step = decoder.step()          # `steps_per_call` tokens for every active slot
        ...                            # stream step.tokens_of(slot), admit into free slots

A server or a rollout loop adds and retires sequences between steps without recompiling and
without waiting for the longest row: `admit` prefills one request into a free slot (one program
per prompt-length bucket), `step` runs `steps_per_call` decode steps, each feeding every slot's
last token and sampling the next (one program per sampling strategy: plain temperature, top-k,
top-p), and a slot whose row stops or reaches its limit is free again. A call runs the leading
slots up to the last busy one (rounded up to a power of two) and attends over the cache
positions the busy rows reach (rounded up to a length bucket), so a lightly loaded decoder pays
for what it holds, with a few programs; a free slot inside that range takes a throwaway token
and keeps its length (admission overwrites its whole row).

Randomness is per request, not per call: the k-th token of a request is drawn with
`fold_in(key(seed), k)`, so the same prompt, settings and seed give the same completion whatever
slot it lands in and whoever decodes beside it (`models.Sampler` draws one key per call). Greedy
rows are deterministic, as in the `Sampler`.

The whole-batch `models.Sampler` stays the fast path for a batch known up front (one compiled
`while_loop`, no host round trip per token, speculative decoding, shared prefixes, sharded rows);
`SlotDecoder` is for traffic that arrives and leaves while others decode. It decodes plainly
(no draft head) and keeps its caches as GSPMD lays them out (not split by rows on a mesh).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models._cache import AttentionCache, Cache
from models._model import Qwen
from models._sampler import _graph_for, bucket
from models._sampler_loop import _scores
from models._sampling import (
    Sampling,
    SamplingArrays,
    Standard,
    strategy_for,
)

_DEFAULT = Sampling()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotState:
    """Every slot's decoding state (device arrays, `S` rows)."""

    cache: Cache
    pending: jax.Array  # int32[S] the last emitted token, not yet fed
    keys: jax.Array  # key[S] the request's base key
    count: jax.Array  # int32[S] tokens emitted so far
    max_lengths: jax.Array  # int32[S]
    active: jax.Array  # bool[S]
    params: SamplingArrays  # per slot


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """The tokens of one call (host arrays): up to `n` per slot, `n` the decode steps the call
    ran (1 for `admit`); a slot's tokens are the entries of its row with `emitted` set, in
    order (`tokens_of`).

    Attributes:
        tokens: int32[S, n] the token each slot emitted at each step (pad where none).
        logprobs: f32[S, n] under the sampling distribution (0 for greedy).
        policy_logprobs: f32[S, n] under the unmodified policy.
        emitted: bool[S, n] where a slot emitted a token.
        finished: bool[S] slots whose row ended during this call (free from now on).
        stopped: bool[S] of the finished, those that ended on a stop token.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    emitted: np.ndarray
    finished: np.ndarray
    stopped: np.ndarray

    def tokens_of(self, slot: int) -> list[int]:
        return [int(t) for t in self.tokens[slot][self.emitted[slot]]]

    def policy_logprobs_of(self, slot: int) -> list[float]:
        return [float(x) for x in self.policy_logprobs[slot][self.emitted[slot]]]


def _put_row(big: jax.Array, row: jax.Array, slot: jax.Array) -> jax.Array:
    """big[:, slot] = row[:, 0] for cache arrays [layers, B, ...]."""
    return jax.lax.dynamic_update_slice_in_dim(big, row.astype(big.dtype), slot, axis=1)


def _draw(keys: jax.Array, count: jax.Array, logp: jax.Array) -> jax.Array:
    """One token per row from log-probs [S, V], row b with fold_in(keys[b], count[b])."""
    sub = jax.vmap(jax.random.fold_in)(keys, count)
    return jax.vmap(lambda k, lp: jax.random.categorical(k, lp))(sub, logp).astype(jnp.int32)


def _is_stop(tokens: jax.Array, stop_tokens: jax.Array) -> jax.Array:
    return jnp.any(tokens[:, None] == stop_tokens[None, :], axis=-1)


def _admit(graph, weights, state: SlotState, slot, prompt, length, max_length, params, key,
           stop_tokens, *, strategy: Standard, slot_length: int):  # fmt: skip
    """Prefills `prompt` [1, P] (right-padded to a bucket) into `slot` and samples its first
    token; returns (state, (token, logprob, policy_logprob, finished, stopped))."""
    target = nnx.merge(graph, weights)
    row_cache = target.init_cache(1, slot_length)
    segment_ids = (jnp.arange(prompt.shape[1])[None, :] < length).astype(jnp.int32)
    out = target(prompt, segment_ids=segment_ids, cache=row_cache)
    hidden = out.hidden[0, length - 1][None, :]
    logits = target._unembed(hidden)
    logp = strategy(logits, params)
    token = _draw(key[None], jnp.zeros((1,), jnp.int32), logp)
    lp, plp = _scores(logp, logits, token)
    stopped = _is_stop(token, stop_tokens)[0]
    finished = stopped | (max_length <= 1)
    cache = Cache(
        end=state.cache.end.at[slot].set(out.cache.end[0]),
        layers=jax.tree.map(
            lambda big, row: _put_row(big, row, slot), state.cache.layers, out.cache.layers
        ),  # fmt: skip
    )

    def put(x, value):
        return x.at[slot].set(value)

    new = SlotState(
        cache=cache,
        pending=put(state.pending, token[0]),
        keys=put(state.keys, key),
        count=put(state.count, 1),
        max_lengths=put(state.max_lengths, max_length),
        active=put(state.active, ~finished),
        params=jax.tree.map(lambda x, v: put(x, v[0]), state.params, params),
    )
    return new, (token[0], lp[0], plp[0], finished, stopped)


def _step(graph, weights, state: SlotState, stop_tokens, *, strategy: Standard):
    """Feeds every active slot's pending token and samples its next one."""
    target = nnx.merge(graph, weights)
    # Every row is fed, so the call needs no padding mask: a free slot's row takes a
    # throwaway token and keeps its length (its cache contents no longer matter: admission
    # overwrites the whole row).
    out = target(state.pending[:, None], cache=state.cache)
    cache = dataclasses.replace(
        out.cache, end=jnp.where(state.active, out.cache.end, state.cache.end)
    )
    logits = out.logits[:, 0]
    logp = strategy(logits, state.params)
    token = _draw(state.keys, state.count, logp)
    lp, plp = _scores(logp, logits, token)
    emitted = state.active
    count = state.count + emitted.astype(jnp.int32)
    stopped = emitted & _is_stop(token, stop_tokens)
    finished = emitted & (stopped | (count >= state.max_lengths))
    new = dataclasses.replace(
        state,
        cache=cache,
        pending=jnp.where(emitted, token, state.pending),
        count=count,
        active=state.active & ~finished,
    )
    return new, (token, lp, plp, emitted, finished, stopped)


def _window(cache: Cache, width: int) -> Cache:
    """The cache with every attention layer's keys and values cut to the first `width`
    positions (the DeltaNet states are whole)."""
    layers = tuple(
        AttentionCache(layer.k[:, :, :width], layer.v[:, :, :width])
        if isinstance(layer, AttentionCache) else layer
        for layer in cache.layers
    )  # fmt: skip
    return Cache(end=cache.end, layers=layers)


def _unwindow(full: Cache, part: Cache) -> Cache:
    """`full` with the windowed layers of `part` written back over their first positions."""

    def back(f, p):
        if not isinstance(f, AttentionCache):
            return p
        put = jax.lax.dynamic_update_slice_in_dim
        return AttentionCache(put(f.k, p.k, 0, axis=2), put(f.v, p.v, 0, axis=2))

    layers = tuple(back(f, p) for f, p in zip(full.layers, part.layers, strict=True))
    return Cache(end=part.end, layers=layers)


def _first_rows(state: SlotState, rows: int) -> SlotState:
    """The state of the first `rows` slots (cache arrays carry a leading layers axis)."""
    cache = Cache(
        end=state.cache.end[:rows],
        layers=jax.tree.map(lambda x: x[:, :rows], state.cache.layers),
    )
    rest = jax.tree.map(lambda x: x[:rows], dataclasses.replace(state, cache=None))
    return dataclasses.replace(rest, cache=cache)


def _put_rows(full: SlotState, part: SlotState) -> SlotState:
    """`full` with its first slots replaced by `part`'s."""
    put = jax.lax.dynamic_update_slice_in_dim
    cache = Cache(
        end=put(full.cache.end, part.cache.end, 0, axis=0),
        layers=jax.tree.map(
            lambda f, p: put(f, p, 0, axis=1), full.cache.layers, part.cache.layers
        ),  # fmt: skip
    )
    rest = jax.tree.map(
        lambda f, p: put(f, p, 0, axis=0),
        dataclasses.replace(full, cache=None),
        dataclasses.replace(part, cache=None),
    )
    return dataclasses.replace(rest, cache=cache)


def _steps(graph, weights, state: SlotState, stop_tokens, *, strategy: Standard, steps: int,
           width: int, rows: int):  # fmt: skip
    """`steps` decode steps in one program (per-call overheads, such as the relayout of the
    weights, are paid once) over the first `rows` slots (every busy slot is among them),
    attending over the first `width` cache positions (every busy row's tokens fit in them);
    outputs [rows, steps], `finished` / `stopped` [rows] over the call."""
    full = state
    state = _first_rows(full, rows)
    cache = state.cache
    state = dataclasses.replace(state, cache=_window(cache, width))

    def body(st, _):
        return _step(graph, weights, st, stop_tokens, strategy=strategy)

    state, (token, lp, plp, emitted, finished, stopped) = jax.lax.scan(
        body, state, None, length=steps
    )
    state = dataclasses.replace(state, cache=_unwindow(cache, state.cache))
    state = _put_rows(full, state) if rows < full.pending.shape[0] else state
    return state, (token.T, lp.T, plp.T, emitted.T, finished.any(0), stopped.any(0))


def _pad_rows(x: np.ndarray, slots: int) -> np.ndarray:
    """x [rows, ...] padded with zeros (False) to [slots, ...]."""
    if x.shape[0] == slots:
        return x
    return np.concatenate([x, np.zeros((slots - x.shape[0],) + x.shape[1:], x.dtype)])


class SlotDecoder:
    """Step-wise decoding over `slots` rows (see the module docstring).

    Args:
        model: the policy (`Qwen`).
        slots: rows decoded together per step (the most requests in flight).
        max_length: prompt plus generated tokens per slot (default: the model's
            `max_position_embeddings`); every slot's cache has this many positions.
        stop_tokens: ids that end a row (the stop token is emitted).
        pad_id: the token reported for slots that emitted nothing.
        min_bucket: smallest prompt-length bucket of `admit` (lengths are rounded up to the
            next of 1, 1.5, 2, 3, 4, 6, ... x `min_bucket`, one program each).
        decode_overrides: runtime `QwenConfig` fields for the decode step only, e.g.
            `{"moe_dispatch": "dense"}` (as `models.Sampler`'s).
        steps_per_call: decode steps each `step()` runs in one program. A single step per
            call costs 2.3x the per-token time of `Sampler`'s compiled loop on the bench's
            mid-size model on CPU (48 vs 21 ms: per-call work such as weight relayouts);
            8 steps per call match it (20.9 ms). Requests are admitted between calls, so
            larger values delay a newcomer's first token by up to that many steps.
    """

    def __init__(
        self,
        model: Qwen,
        *,
        slots: int,
        max_length: int | None = None,
        stop_tokens: Sequence[int] = (),
        pad_id: int = 0,
        min_bucket: int = 16,
        decode_overrides: Mapping[str, Any] | None = None,
        steps_per_call: int = 8,
    ):
        max_length = max_length or model.config.max_position_embeddings
        if steps_per_call < 1:
            raise ValueError(f"SlotDecoder: steps_per_call={steps_per_call} must be >= 1")
        self.steps_per_call = steps_per_call
        if slots < 1 or max_length < 2 or min_bucket < 1:
            raise ValueError(
                f"SlotDecoder: need slots >= 1, max_length >= 2 and min_bucket >= 1; got "
                f"{slots}, {max_length}, {min_bucket}"
            )
        self.vocab_size = model.config.vocab_size
        bad = [t for t in stop_tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"SlotDecoder: stop tokens {bad} outside [0, {self.vocab_size})")
        self.slots, self.max_length = slots, max_length
        self.pad_id, self.min_bucket = pad_id, min_bucket
        self._graphs = (nnx.graphdef(model), _graph_for(model, decode_overrides))
        self._weights = nnx.state(model)
        stops = np.full((bucket(max(len(stop_tokens), 1), 4),), -1, np.int32)
        stops[: len(stop_tokens)] = [int(t) for t in stop_tokens]
        self._stops = jnp.asarray(stops)
        self._traces = {"admit": 0, "step": 0}

        def admit(graph, weights, state, *args, strategy, slot_length):
            self._traces["admit"] += 1
            return _admit(graph, weights, state, *args, strategy=strategy,
                          slot_length=slot_length)  # fmt: skip

        def step(graph, weights, state, stop_tokens, *, strategy, width, rows):
            self._traces["step"] += 1
            return _steps(graph, weights, state, stop_tokens, strategy=strategy,
                          steps=steps_per_call, width=width, rows=rows)  # fmt: skip

        self._admit = jax.jit(
            admit, static_argnums=(0,), static_argnames=("strategy", "slot_length"),
            donate_argnums=(2,),
        )  # fmt: skip
        self._step = jax.jit(
            step,
            static_argnums=(0,),
            static_argnames=("strategy", "width", "rows"),
            donate_argnums=(2,),
        )
        self._settings: list[Sampling | None] = [None] * slots
        self._active = np.zeros(slots, bool)
        self._ends = np.zeros(slots, np.int64)  # tokens each slot's cache holds
        self._state = SlotState(
            cache=model.init_cache(slots, max_length),
            pending=jnp.zeros((slots,), jnp.int32),
            keys=jax.random.split(jax.random.key(0), slots),
            count=jnp.zeros((slots,), jnp.int32),
            max_lengths=jnp.ones((slots,), jnp.int32),
            active=jnp.zeros((slots,), bool),
            params=SamplingArrays.from_rows([Sampling()] * slots),
        )
        # Every leaf its own buffer (the state is donated to each call, and constants may
        # share one).
        self._state = jax.tree.map(
            lambda x: jnp.array(x, copy=True),
            dataclasses.replace(
                self._state, cache=dataclasses.replace(self._state.cache, empty=False)
            ),
        )

    @property
    def compilations(self) -> dict[str, int]:
        """Programs traced so far: `admit` (one per prompt bucket and strategy) and `step`
        (one per strategy, attention-window bucket and power-of-two count of leading slots)."""
        return dict(self._traces)

    @property
    def active(self) -> np.ndarray:
        """bool[S]: slots holding a row that is still generating."""
        return self._active.copy()

    def free_slots(self) -> list[int]:
        """The free slots, lowest first (fill them in this order: a call runs the slots up
        to the last busy one)."""
        return [i for i in range(self.slots) if not self._active[i]]

    def update(self, model: Qwen) -> None:
        """Takes new weights (same structure) without recompiling; rows in flight continue
        with them."""
        self._weights = nnx.state(model)

    def admit(
        self,
        slot: int,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: Sampling = _DEFAULT,
        seed: int = 0,
    ) -> StepOutput:
        """Prefills `prompt` into the free `slot` and samples its first token (returned as a
        one-row `StepOutput`; `finished` if it already ends the row). ValueError names a bad
        slot, prompt or limit."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"SlotDecoder.admit: slot {slot} outside [0, {self.slots})")
        if self._active[slot]:
            raise ValueError(f"SlotDecoder.admit: slot {slot} is busy")
        ids = np.asarray(prompt, np.int64).reshape(-1)
        if ids.size < 1:
            raise ValueError("SlotDecoder.admit: the prompt is empty (it needs a token)")
        if max_new_tokens < 1:
            raise ValueError(f"SlotDecoder.admit: max_new_tokens={max_new_tokens} must be >= 1")
        if ids.size + max_new_tokens > self.max_length:
            raise ValueError(
                f"SlotDecoder.admit: {ids.size} prompt + {max_new_tokens} new tokens = "
                f"{ids.size + max_new_tokens} > max_length={self.max_length}"
            )
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise ValueError(
                f"SlotDecoder.admit: token ids {bad[:5].tolist()} outside [0, {self.vocab_size})"
            )
        if not isinstance(sampling, Sampling):
            raise TypeError("SlotDecoder.admit: sampling must be a models.Sampling")
        padded = np.full((1, min(bucket(ids.size, self.min_bucket), self.max_length)),
                         self.pad_id, np.int32)  # fmt: skip
        padded[0, : ids.size] = ids
        self._state, out = self._admit(
            self._graphs[0],
            self._weights,
            self._state,
            jnp.int32(slot),
            jnp.asarray(padded),
            jnp.int32(ids.size),
            jnp.int32(max_new_tokens),
            jax.tree.map(jnp.asarray, SamplingArrays.from_rows([sampling])),
            jax.random.key(int(seed)),
            self._stops,
            strategy=strategy_for([sampling]),
            slot_length=self.max_length,
        )
        token, lp, plp, finished, stopped = (np.asarray(x) for x in jax.device_get(out))
        self._settings[slot] = sampling
        self._active[slot] = not bool(finished)
        self._ends[slot] = ids.size
        return StepOutput(
            tokens=token.reshape(1, 1).astype(np.int32),
            logprobs=lp.reshape(1, 1),
            policy_logprobs=plp.reshape(1, 1),
            emitted=np.ones((1, 1), bool),
            finished=finished.reshape(1),
            stopped=stopped.reshape(1),
        )

    def step(self) -> StepOutput:
        """`steps_per_call` tokens for every active slot (fewer for rows that end; a no-op
        when none is active)."""
        n = self.steps_per_call
        if not self._active.any():
            none = np.zeros((self.slots, n), bool)
            return StepOutput(
                np.full((self.slots, n), self.pad_id, np.int32), np.zeros((self.slots, n),
                np.float32), np.zeros((self.slots, n), np.float32), none,
                np.zeros(self.slots, bool), np.zeros(self.slots, bool),
            )  # fmt: skip
        busy = [s for s, a in zip(self._settings, self._active) if a]
        # Attention runs over the positions the busy rows reach in this call, rounded up to
        # a bucket (one program per bucket), not over all `max_length`.
        reach = int(self._ends[self._active].max()) + n
        width = min(bucket(reach, self.min_bucket), self.max_length)
        # Likewise only the first slots up to the last busy one, rounded up to a power of
        # two (`admit` callers fill the lowest free slots first: `free_slots` lists them so).
        rows = min(1 << int(np.flatnonzero(self._active).max()).bit_length(), self.slots)
        self._state, out = self._step(
            self._graphs[1], self._weights, self._state, self._stops,
            strategy=strategy_for(busy), width=width, rows=rows,
        )  # fmt: skip
        part = [np.asarray(x) for x in jax.device_get(out)]
        token, lp, plp, emitted, finished, stopped = (_pad_rows(x, self.slots) for x in part)
        self._active &= ~finished
        self._ends += emitted.sum(1)
        return StepOutput(
            tokens=np.where(emitted, token, self.pad_id).astype(np.int32),
            logprobs=np.where(emitted, lp, 0.0),
            policy_logprobs=np.where(emitted, plp, 0.0),
            emitted=emitted,
            finished=finished,
            stopped=stopped,
        )

    def warmup(
        self, prompt_lengths: Sequence[int], max_new_tokens: int, sampling: Sampling = _DEFAULT
    ) -> int:
        """Compiles admission for prompts of these lengths and every decode program requests
        of those lengths with up to `max_new_tokens` can need (each power-of-two count of
        leading slots x each attention-window bucket), for this sampling strategy; returns
        the number of programs compiled. Every slot must be free."""
        if self._active.any():
            raise ValueError("SlotDecoder.warmup: slots are busy")
        if not prompt_lengths:
            return 0
        before = sum(self._traces.values())
        for length in prompt_lengths:  # a one-token limit: the slot is free again at once
            self.admit(0, [self.pad_id] * int(length), max_new_tokens=1, sampling=sampling)
        n = self.steps_per_call
        low, high = min(prompt_lengths) + n, max(prompt_lengths) + max_new_tokens + n
        widths = sorted({min(bucket(x, self.min_bucket), self.max_length)
                         for x in range(low, high + 1)})  # fmt: skip
        rows = sorted({min(1 << i, self.slots) for i in range(self.slots.bit_length() + 1)})
        strategy = strategy_for([sampling])
        for r in rows:
            for w in widths:
                self._state, out = self._step(
                    self._graphs[1], self._weights, self._state, self._stops,
                    strategy=strategy, width=w, rows=r,
                )  # fmt: skip
        jax.block_until_ready(out)
        return sum(self._traces.values()) - before

    def cancel(self, slot: int) -> None:
        """Frees `slot` before its row ends (e.g. the client went away)."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"SlotDecoder.cancel: slot {slot} outside [0, {self.slots})")
        if self._active[slot]:
            self._state = dataclasses.replace(
                self._state, active=self._state.active.at[slot].set(False)
            )
            self._active[slot] = False

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: Sampling | Sequence[Sampling] = _DEFAULT,
        seeds: Sequence[int] | None = None,
    ) -> list[list[int]]:
        """Decodes every prompt through the slots (admitting the next queued prompt as soon as
        a slot frees) and returns each completion's tokens (the stop token included)."""
        n = len(prompts)
        budgets = [int(max_new_tokens)] * n if np.ndim(max_new_tokens) == 0 else list(
            max_new_tokens)  # fmt: skip
        rows = [sampling] * n if isinstance(sampling, Sampling) else list(sampling)
        seeds = list(range(n)) if seeds is None else list(seeds)
        if not len(budgets) == len(rows) == len(seeds) == n:
            raise ValueError("SlotDecoder.generate: one budget, setting and seed per prompt")
        if self._active.any():
            raise ValueError("SlotDecoder.generate: slots are busy (another user is decoding)")
        results: list[list[int]] = [[] for _ in range(n)]
        owner: dict[int, int] = {}
        queue = list(range(n))[::-1]
        while queue or owner:
            for slot in self.free_slots():
                if not queue:
                    break
                i = queue.pop()
                first = self.admit(slot, prompts[i], max_new_tokens=budgets[i],
                                   sampling=rows[i], seed=seeds[i])  # fmt: skip
                results[i].extend(first.tokens_of(0))
                if not first.finished[0]:
                    owner[slot] = i
            if not owner:
                continue
            out = self.step()
            for slot in np.flatnonzero(out.emitted.any(1)):
                results[owner[slot]].extend(out.tokens_of(slot))
                if out.finished[slot]:
                    del owner[slot]
        return results
