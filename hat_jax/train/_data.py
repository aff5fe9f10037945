"""The batch-source interfaces the trainer consumes, and a synthetic packed-token source.

Any iterator of dict batches with savable state plugs into the trainer (the Grain pipeline
in `data/` is the real one): a `DataSource`. An on-policy stage (OPD, RL) plugs in an
`OnPolicySource` instead: the trainer hands it the current model(s) and it samples the next
batch with those weights. A batch is the *process-local* rows of the global batch:

- `input_ids`   int32 [b, T]  token ids of packed rows
- `loss_mask`   int32 [b, T]  1 on tokens to learn (assistant-produced), else 0
- `segment_ids` int32 [b, T]  1, 2, ... per packed document; 0 on padding
- `positions`   int32 [b, T]  position within its document, restarting at 0 per segment

where b = global batch / `jax.process_count()`. `get_state()` returns a JSON-serialisable
dict (or bytes / str) taken *after* the last batch returned, and `set_state(state)` resumes
exactly there: the trainer saves it with every checkpoint. For an on-policy source that state
includes its sampling RNG position, so a resumed run samples what an uninterrupted one would.

A checkpoint written by another number of processes holds one state per process of that
run. A source whose class sets `resplits_states = True` takes the list of them in
`set_state` and reads on from its part (the Grain pipeline does, by data shards; the
on-policy sources of OPD, RL and MTP do, their positions being the same on every process);
the trainer refuses such a checkpoint for any other source, naming the process counts.

`SyntheticTokenSource` is for tests, benchmarks and plans only (its tokens follow simple
learnable rules, so losses fall); training stages use the data pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hat_jax.batch import BATCH_KEYS


@runtime_checkable
class DataSource(Protocol):
    """An iterator of process-local dict batches whose position can be saved and restored."""

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]: ...

    def __next__(self) -> dict[str, np.ndarray]: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


@runtime_checkable
class OnPolicySource(Protocol):
    """Samples each batch with the current weights; its position can be saved and restored.

    `next_batch(model)` gets the model(s) of the current train state (as `merge_model` builds
    them; do not keep them past the call: the next step donates their arrays) and returns
    this process's rows and host figures about them (e.g. response lengths), logged with the
    step's metrics. Raises StopIteration when it has nothing left.
    """

    def next_batch(self, model: Any) -> tuple[dict[str, np.ndarray], Mapping[str, float]]: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


def shared_state(
    state: Mapping[str, Any] | Sequence[Mapping[str, Any]], owner: str
) -> Mapping[str, Any]:
    """The position of a source whose state is the same on every process: `state` itself,
    or the one state in the list every process of a run with another process count saved.

    Raises:
      ValueError: the saved states differ (named with `owner`).
    """
    if isinstance(state, Mapping):
        return state
    states = list(state)
    if not states or any(dict(s) != dict(states[0]) for s in states):
        raise ValueError(f"{owner}: the processes' saved positions differ: {states}")
    return states[0]


class SyntheticTokenSource:
    """Deterministic packed rows of random "documents" (tests, benchmarks, plans).

    Each document is a prompt (loss mask 0) then an answer (loss mask 1); each document's
    tokens follow `t[i+1] = (t[i] + stride) mod vocab` with a random start and stride, so a
    model can learn them. Batch n depends only on (seed, n, process index).
    """

    def __init__(
        self,
        *,
        batch_size: int,
        seq_len: int,
        vocab_size: int,
        seed: int = 0,
        mean_doc_len: int = 48,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if batch_size % process_count:
            raise ValueError(f"batch_size {batch_size} not divisible by {process_count} processes")
        if vocab_size < 4 or seq_len < 2:
            raise ValueError(f"need vocab_size >= 4 and seq_len >= 2, got {vocab_size}, {seq_len}")
        self.local_batch = batch_size // process_count
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.mean_doc_len, self.process_index = mean_doc_len, process_index
        self._next = 0

    def __iter__(self) -> SyntheticTokenSource:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self._next, self.process_index])
        self._next += 1
        rows = [self._row(rng) for _ in range(self.local_batch)]
        return {k: np.stack([r[k] for r in rows]).astype(np.int32) for k in BATCH_KEYS}

    def _row(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        t = self.seq_len
        row = {k: np.zeros(t, np.int64) for k in BATCH_KEYS}
        start, segment = 0, 1
        while start < t - 1:
            length = min(int(rng.geometric(1.0 / self.mean_doc_len)) + 1, t - start)
            if rng.random() < 0.1 and segment > 1:
                break  # leave the rest of the row as padding
            first, stride = rng.integers(1, self.vocab_size), rng.integers(1, 4)
            span = slice(start, start + length)
            row["input_ids"][span] = (first + stride * np.arange(length)) % self.vocab_size
            prompt = int(rng.integers(1, max(length // 2, 1) + 1))
            row["loss_mask"][start + prompt : start + length] = 1
            row["segment_ids"][span] = segment
            row["positions"][span] = np.arange(length)
            start, segment = start + length, segment + 1
        return row

    def get_state(self) -> dict[str, int]:
        return {"next_batch": self._next, "seed": self.seed}

    def set_state(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"data state is for seed {state['seed']}, this source has {self.seed}")
        self._next = int(state["next_batch"])
