"""`Sampler`: batched generation from a `Qwen` policy, optionally self-speculative with an
`MTPHead`.

    sampler = Sampler(model)                                   # or Sampler(model, mtp=head,
    out = sampler([[1, 2, 3], [4, 5]], max_new_tokens=64,      #    num_draft_tokens=3)
                  sampling=Sampling(temperature=0.7, top_p=0.95), stop_tokens=[eos], seed=0)
    out.completion(0), out.logprobs, out.policy_logprobs, out.rows()["sampled_mask"]

Requests are padded into buckets — batch size, prompt length and generation length each
rounded up to the next of 1, 1.5, 2, 3, 4, 6, 8, 12, ... x `min_bucket` — so repeated rollouts
with varying lengths reuse a few compiled programs (`compilations` counts them). Everything
per row (prompt, length limit, sampling settings) is an array; stop tokens are an array too.

Returned per token: the id, its log-probability under the sampling distribution (after
temperature / top-k / top-p; 0 for greedy), and under the unmodified policy (temperature 1,
no filter: what a training forward pass on the same tokens computes, the old log-probs of
GRPO/GSPO). `rows()` lays prompt and completion out as training rows with the sampled-vs-forced
mask: 1 on tokens the policy sampled, 0 on the prompt (forced) and padding.

On a mesh (weights sharded as in training, e.g. on a stage driver's mesh, or `mesh=...`)
the call's rows are split over the data-like mesh axes by `hat_jax.sharding.SAMPLING_RULES`
(`batch` -> `data`, `fsdp`): the batch bucket is rounded up to a multiple of that split, the
request arrays are placed row-sharded, and the program traces under those rules, so the
caches (attention keys and values, DeltaNet conv and recurrent states) are created, filled
and carried through the decode loop sharded by rows (`models._sampler_loop`). Each device
holds its rows' caches only; the weights stay as they are.

In a job of several JAX processes the weights span every process's devices and a call is
one program across the job: every process calls with the same prompts, settings and seed
(gather them with `hat_jax.sharding.all_process_rows`), and every process gets every row
(the small output buffers are gathered; the caches never leave their devices).
A call whose inputs differ between processes raises an error naming them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hat_jax.sharding import (
    SAMPLING_RULES,
    check_same_on_all_processes,
    data_parallel_size,
    logical_to_spec,
    to_host,
    use_rules,
)
from models import _sampler_loop as loop
from models._model import Qwen
from models._mtp import MTPHead
from models._sampling import Sampling, SamplingArrays, Strategy, strategy_for

DEFAULT_SAMPLING = Sampling()


def bucket(n: int, minimum: int) -> int:
    """The smallest of minimum x {1, 1.5, 2, 3, 4, 6, 8, ...} that is >= n."""
    if n <= minimum:
        return minimum
    size = minimum
    while True:
        for candidate in (size, size * 3 // 2):
            if candidate >= n:
                return candidate
        size *= 2


@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """Generated tokens of one `Sampler` call (numpy, one row per prompt).

    Attributes:
        prompts: the prompts as given (int32 arrays).
        tokens: int32[B, G] generated tokens; entries past `lengths` are `pad_id`.
        lengths: int32[B] tokens generated per row (the stop token included).
        logprobs: f32[B, G] log-probabilities under the sampling distribution (0 past length).
        policy_logprobs: f32[B, G] log-probabilities under the unmodified policy.
        stopped: bool[B], True where the row ended on a stop token (else its length limit).
        pad_id: the padding token id.
        acceptance_length: speculative decoding only: mean tokens emitted per verification
            (accepted drafts + 1), over rows still generating; None otherwise.
        verifications: speculative decoding only: the row-steps verified (the weight of
            `acceptance_length` when several calls are pooled: `combine_acceptance`).
    """

    prompts: tuple[np.ndarray, ...]
    tokens: np.ndarray
    lengths: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    stopped: np.ndarray
    pad_id: int
    acceptance_length: float | None = None
    verifications: int = 0

    def completion(self, i: int) -> list[int]:
        """The generated token ids of row i."""
        return self.tokens[i, : self.lengths[i]].tolist()

    def rows(self, seq_len: int | None = None) -> dict[str, np.ndarray]:
        """Prompt + completion per row as training rows, right-padded to `seq_len`
        (default: the longest row). Keys: `input_ids`, `sampled_mask` (1 on sampled tokens),
        `logprobs`, `policy_logprobs` (aligned with the tokens, 0 on forced ones),
        `segment_ids` (1 on the row's tokens, 0 on padding), `positions`.

        Raises:
            ValueError: a row does not fit `seq_len`.
        """
        total = [len(p) + int(n) for p, n in zip(self.prompts, self.lengths)]
        seq_len = seq_len or max(total)
        if max(total) > seq_len:
            raise ValueError(f"SampleOutput.rows: a row has {max(total)} tokens > {seq_len}")
        batch = len(self.prompts)
        out = {
            "input_ids": np.full((batch, seq_len), self.pad_id, np.int32),
            "sampled_mask": np.zeros((batch, seq_len), np.int32),
            "logprobs": np.zeros((batch, seq_len), np.float32),
            "policy_logprobs": np.zeros((batch, seq_len), np.float32),
            "segment_ids": np.zeros((batch, seq_len), np.int32),
            "positions": np.zeros((batch, seq_len), np.int32),
        }
        for i, prompt in enumerate(self.prompts):
            p, n = len(prompt), int(self.lengths[i])
            out["input_ids"][i, :p] = prompt
            out["input_ids"][i, p : p + n] = self.tokens[i, :n]
            out["sampled_mask"][i, p : p + n] = 1
            out["logprobs"][i, p : p + n] = self.logprobs[i, :n]
            out["policy_logprobs"][i, p : p + n] = self.policy_logprobs[i, :n]
            out["segment_ids"][i, : p + n] = 1
            out["positions"][i, : p + n] = np.arange(p + n)
        return out


def _graph_for(model: nnx.Module, overrides: Mapping[str, Any] | None) -> nnx.GraphDef:
    """The graph of a `Qwen` or `MTPHead` with runtime config fields replaced (same parameter
    structure)."""
    graphdef = nnx.graphdef(model)
    if not overrides:
        return graphdef
    config = model.config.replace(**overrides)
    abstract = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
    other, abstract_state = nnx.split(abstract)
    ours = jax.tree.structure(nnx.state(model))
    if jax.tree.structure(abstract_state) != ours:
        raise ValueError(f"Sampler: overrides {dict(overrides)} change the parameter structure")
    return other


def _mesh_of(state: Any) -> jax.sharding.Mesh | None:
    """The mesh of the first array of `state` that is laid out on one of more than one
    device (None: the weights are on a single device)."""
    for leaf in jax.tree.leaves(state):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


def shared_prefix_length(prompts: Sequence[Sequence[int]], *, multiple: int = 512) -> int:
    """The longest prefix every prompt shares, rounded down to a multiple of `multiple` (so a
    handful of prefix shapes are compiled) and leaving each row one token of its own: the
    `shared_prefix` to pass to `Sampler.__call__` (0 for a single prompt or nothing shared).
    """
    if len(prompts) < 2 or multiple < 1:
        return 0
    rows = [np.asarray(p).reshape(-1) for p in prompts]
    limit = min(len(r) for r in rows) - 1
    first = rows[0][:limit]
    same = np.ones(len(first), bool)
    for r in rows[1:]:
        same &= r[:limit] == first
    common = int(np.argmin(same)) if not same.all() else len(first)
    return common // multiple * multiple


class Sampler:
    """Batched generation with bucketed shapes (see the module docstring).

    Args:
        model: the policy (`Qwen`).
        mtp: a draft head for self-speculative decoding (with `num_draft_tokens` > 0).
        num_draft_tokens: k drafts verified per step; 0 decodes plainly.
        pad_id: padding token id (prompt padding and unused output slots).
        min_bucket: smallest prompt / generation length bucket.
        decode_overrides: runtime `QwenConfig` fields for the decode steps only, e.g.
            `{"moe_dispatch": "dense"}` (per-token steps route a handful of tokens, where the
            block-padded sorted dispatch wastes most of its rows); prefill keeps the model's.
            The draft head's steps use them too.
        max_length: the cap on prompt plus generated tokens per row (default: the model's
            `max_position_embeddings`); buckets never exceed it and longer requests fail.
        mesh: the mesh whose data-like axes split the rows and caches (default: the mesh the
            model's weights are sharded on, if any; None for weights on one device).
    """

    def __init__(
        self,
        model: Qwen,
        *,
        mtp: MTPHead | None = None,
        num_draft_tokens: int = 0,
        pad_id: int = 0,
        min_bucket: int = 16,
        decode_overrides: Mapping[str, Any] | None = None,
        max_length: int | None = None,
        mesh: jax.sharding.Mesh | None = None,
    ):
        max_length = max_length or model.config.max_position_embeddings
        if min_bucket < 1 or max_length < 2:
            raise ValueError(
                f"Sampler: need min_bucket >= 1 and max_length >= 2, got {min_bucket}, {max_length}"
            )
        if num_draft_tokens < 0:
            raise ValueError(f"Sampler: num_draft_tokens={num_draft_tokens} must be >= 0")
        if num_draft_tokens and mtp is None:
            raise ValueError("Sampler: num_draft_tokens > 0 needs an MTP head (mtp=...)")
        self.num_draft_tokens = num_draft_tokens
        self.pad_id, self.min_bucket, self.max_length = pad_id, min_bucket, max_length
        self.vocab_size = model.config.vocab_size
        self._graphs = (
            nnx.graphdef(model),
            _graph_for(model, decode_overrides),
            _graph_for(mtp, decode_overrides) if num_draft_tokens else None,
        )
        self._states = (nnx.state(model), nnx.state(mtp) if num_draft_tokens else None)
        self.mesh = mesh if mesh is not None else _mesh_of(self._states[0])
        self._rows_multiple = (
            1 if self.mesh is None else data_parallel_size(self.mesh, SAMPLING_RULES)
        )
        self._traces = 0
        self._compiled = jax.jit(
            self._generate,
            static_argnames=("strategy", "gen_slots", "num_draft_tokens"),
            static_argnums=(0,),
        )

    def _generate(self, *args, **kwargs) -> loop.LoopState:
        """`loop.generate`, traced under the sampling rules on the mesh (if any)."""
        if self.mesh is None:
            return loop.generate(*args, on_trace=self._count_trace, **kwargs)
        with use_rules(SAMPLING_RULES, self.mesh):
            return loop.generate(*args, on_trace=self._count_trace, **kwargs)

    def _count_trace(self) -> None:
        self._traces += 1

    @property
    def compilations(self) -> int:
        """Programs traced so far (one per new bucket / strategy combination)."""
        return self._traces

    def update(self, model: Qwen | None = None, mtp: MTPHead | None = None) -> None:
        """Takes new weights (same structure) without recompiling, e.g. after a train step."""
        target_state, head_state = self._states
        if model is not None:
            target_state = nnx.state(model)
        if mtp is not None and self.num_draft_tokens:
            head_state = nnx.state(mtp)
        self._states = (target_state, head_state)

    def _place(self, req: loop.Request) -> loop.Request:
        """The request's host arrays as device arrays: on the mesh, global arrays with the
        per-row ones split by rows (every process holds the same values, checked in
        `__call__`) and the stop tokens replicated."""
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, req)

        def put(x, names):
            spec = logical_to_spec(names, SAMPLING_RULES, self.mesh, x.shape)
            sharding = jax.sharding.NamedSharding(self.mesh, spec)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

        def rows(x):
            return put(x, ("batch",) + (None,) * (x.ndim - 1))

        return loop.Request(
            prompt_ids=rows(req.prompt_ids),
            prompt_lengths=rows(req.prompt_lengths),
            max_lengths=rows(req.max_lengths),
            stop_tokens=put(req.stop_tokens, (None,)),
            params=jax.tree.map(rows, req.params),
        )

    def _check(self, prompts, max_new, stop_tokens) -> None:
        """Raises ValueError naming the first bad row or value."""
        for i, (p, n) in enumerate(zip(prompts, max_new)):
            if len(p) < 1:
                raise ValueError(f"Sampler: prompt {i} is empty (every prompt needs a token)")
            if n < 1:
                raise ValueError(f"Sampler: max_new_tokens of row {i} is {n}; it must be >= 1")
            if len(p) + n > self.max_length:
                raise ValueError(
                    f"Sampler: row {i} needs {len(p)} prompt + {n} new tokens = {len(p) + n} "
                    f"> max_length={self.max_length}"
                )
            bad = p[(p < 0) | (p >= self.vocab_size)]
            if bad.size:
                raise ValueError(
                    f"Sampler: prompt {i} has token ids {bad[:5].tolist()} outside "
                    f"[0, {self.vocab_size})"
                )
        bad_stops = [t for t in stop_tokens if not 0 <= t < self.vocab_size]
        if bad_stops:
            raise ValueError(f"Sampler: stop tokens {bad_stops} outside [0, {self.vocab_size})")

    def _request(self, prompts, max_new, sampling, stop_tokens) -> tuple[loop.Request, int]:
        """The bucketed request as host (numpy) arrays, and the generation slots."""
        batch = len(prompts)
        rows_b = -(-bucket(batch, 1) // self._rows_multiple) * self._rows_multiple
        lengths = [len(p) for p in prompts]
        length_b = min(bucket(max(lengths), self.min_bucket), self.max_length)
        gen_b = min(bucket(max(max_new), self.min_bucket), self.max_length)
        ids = np.full((rows_b, length_b), self.pad_id, np.int32)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = p
        fill = rows_b - batch  # dummy rows: one pad token, one step
        stops = np.full((bucket(max(len(stop_tokens), 1), 4),), -1, np.int32)
        stops[: len(stop_tokens)] = stop_tokens
        req = loop.Request(
            prompt_ids=ids,
            prompt_lengths=np.asarray(lengths + [1] * fill, np.int32),
            max_lengths=np.asarray(list(max_new) + [1] * fill, np.int32),
            stop_tokens=stops,
            params=jax.tree.map(
                np.asarray, SamplingArrays.from_rows(list(sampling) + [Sampling()] * fill)
            ),
        )
        return req, gen_b

    def __call__(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: Sampling | Sequence[Sampling] = DEFAULT_SAMPLING,
        stop_tokens: Sequence[int] = (),
        seed: int | jax.Array = 0,
        strategy: Strategy | None = None,
        shared_prefix: int = 0,
    ) -> SampleOutput:
        """Generates a continuation of every prompt.

        Args:
            prompts: token id lists (unpadded), one per row.
            max_new_tokens: length limit, for all rows or per row.
            sampling: settings for all rows or per row.
            stop_tokens: ids that end a row (the stop token is emitted).
            seed: PRNG seed (or key) of this call.
            strategy: a custom `Strategy` (hashable) instead of the standard one.
            shared_prefix: the number of leading tokens every prompt has in common, prefilled
                once and shared by the rows (e.g. one system prompt in front of many requests;
                `shared_prefix_length` finds it). Each row keeps at least one token of its
                own; with speculative decoding the draft head's cache of the prefix is
                computed once too. 0: every row is prefilled whole.
        """
        prompts = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
        if not prompts:
            raise ValueError("Sampler: no prompts")
        batch = len(prompts)
        if np.ndim(max_new_tokens) == 0:
            max_new = [int(max_new_tokens)] * batch
        else:
            max_new = [int(n) for n in max_new_tokens]
        rows = [sampling] * batch if isinstance(sampling, Sampling) else list(sampling)
        if len(max_new) != batch or len(rows) != batch:
            raise ValueError(
                f"Sampler: {batch} prompts but {len(max_new)} max_new_tokens and {len(rows)} "
                "sampling settings"
            )
        if not all(isinstance(r, Sampling) for r in rows):
            raise TypeError("Sampler: sampling must be a models.Sampling or a list of them")
        stop_tokens = [int(t) for t in stop_tokens]
        self._check(prompts, max_new, stop_tokens)
        prompts = [p.astype(np.int32) for p in prompts]
        prefix = self._prefix(prompts, shared_prefix)
        own = [p[shared_prefix:] for p in prompts] if prefix is not None else prompts
        req, gen_slots = self._request(own, max_new, rows, stop_tokens)
        key = seed if isinstance(seed, jax.Array) else jax.random.key(int(seed))
        if jax.process_count() > 1:
            check_same_on_all_processes(
                [*jax.tree.leaves(req), jax.random.key_data(key),
                 *([] if prefix is None else [prefix])],
                "Sampler: the prompts, settings or seed of this call",
            )  # fmt: skip
        state = self._compiled(
            self._graphs,
            self._states,
            self._place(req),
            key,
            prefix,
            strategy=strategy or strategy_for(rows),
            gen_slots=gen_slots,
            num_draft_tokens=self.num_draft_tokens,
        )
        # Only the outputs travel to the host; the caches stay on the device and are freed.
        counts = None if state.draft is None else (state.draft.accepted, state.draft.verified)
        return self._output(prompts, *to_host((state.out, counts)))

    def _prefix(self, prompts: list[np.ndarray], shared: int) -> jax.Array | None:
        """The shared prefix as [1, P] (None for 0); ValueError if the rows do not share it."""
        if shared == 0:
            return None
        if shared < 0 or any(len(p) <= shared for p in prompts):
            raise ValueError(
                f"Sampler: shared_prefix={shared} must be >= 0 and leave every row at least one "
                f"token of its own (shortest prompt: {min(len(p) for p in prompts)})"
            )
        head = prompts[0][:shared]
        bad = [i for i, p in enumerate(prompts) if not np.array_equal(p[:shared], head)]
        if bad:
            raise ValueError(f"Sampler: rows {bad[:5]} do not share the first {shared} tokens")
        return jnp.asarray(head[None, :])

    def lower(
        self,
        batch: int,
        prompt_len: int,
        max_new_tokens: int,
        sampling: Sampling = DEFAULT_SAMPLING,
    ) -> jax.stages.Lowered:
        """The program a call with `batch` prompts of `prompt_len` tokens and `max_new_tokens`
        compiles, lowered without running (the sampler's weights may be abstract, e.g. sharded
        `jax.ShapeDtypeStruct`s: a memory plan of the sampling phase)."""
        prompts = [np.zeros(prompt_len, np.int32)] * batch
        req, gen_slots = self._request(prompts, [max_new_tokens] * batch, [sampling] * batch, [])
        return self._compiled.lower(
            self._graphs,
            self._states,
            self._place(req),
            jax.random.key(0),
            strategy=strategy_for([sampling]),
            gen_slots=gen_slots,
            num_draft_tokens=self.num_draft_tokens,
        )

    def _output(self, prompts, out: loop.Buffers, counts) -> SampleOutput:
        batch = len(prompts)
        lengths = np.asarray(out.length[:batch])
        valid = np.arange(out.tokens.shape[1])[None, :] < lengths[:, None]
        acceptance, verified = None, 0
        if counts is not None:
            accepted, verified = (int(c) for c in counts)
            acceptance = 1.0 + accepted / max(verified, 1)
        return SampleOutput(
            prompts=tuple(prompts),
            tokens=np.where(valid, np.asarray(out.tokens[:batch]), self.pad_id),
            lengths=lengths,
            logprobs=np.where(valid, np.asarray(out.logprobs[:batch]), 0.0),
            policy_logprobs=np.where(valid, np.asarray(out.policy_logprobs[:batch]), 0.0),
            stopped=np.asarray(out.stopped[:batch]),
            pad_id=self.pad_id,
            acceptance_length=acceptance,
            verifications=verified,
        )


def combine_acceptance(outputs: Sequence[SampleOutput]) -> float | None:
    """The acceptance length of several speculative calls pooled (each weighted by its
    verifications); None when none of them decoded speculatively."""
    spec = [o for o in outputs if o.acceptance_length is not None]
    if not spec:
        return None
    verified = sum(o.verifications for o in spec)
    accepted = sum((o.acceptance_length - 1.0) * o.verifications for o in spec)
    return 1.0 + accepted / max(verified, 1)
