"""The server's engines: requests from many HTTP handlers decoded together on one thread.

`SlotEngine` (the server's default; see its docstring) runs continuous batching over a
`models.SlotDecoder`: requests join and leave between decode calls and their tokens reach a
listener as they are decoded. `BatchEngine`, described below, decodes whole batches with one
`models.Sampler` call each (and so can decode speculatively).

One worker thread owns the sampler. It takes the first waiting request and every request
already queued, then waits up to `window_s` for more while it holds fewer rows than the largest
of the last 8 batches (N clients that each send again on their answer arrive a few milliseconds apart;
a lone client waits for nobody), up to `max_rows` rows, and decodes them in one call: rows
have their own prompt, length limit and sampling settings. Requests that arrive while a
batch is decoding wait and join the next batch, so N concurrent clients cost about one call
instead of N.

Compiled shapes: the sampler compiles one program per (rows, prompt length, generation length)
bucket. The engine rounds a batch's rows up to a power of two (extra rows repeat the first
prompt and generate one token), so batches of 1 to `max_rows` rows need at most
log2(max_rows) + 1 programs per length bucket, and `warmup` compiles them before traffic.

Reproducibility: a request with a `seed` and temperature > 0 is decoded in a call of its own
(the sampler draws one key per call, so a row's sample would otherwise depend on the rows
beside it); the same prompt, settings and seed then give the same completion. Greedy and
unseeded requests batch freely.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

import models


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated row: its token ids (the stop token included) and why it ended."""

    token_ids: tuple[int, ...]
    stopped: bool  # ended on a stop token (else its length limit)


@dataclasses.dataclass
class _Job:
    prompts: list[list[int]]
    max_new_tokens: int
    sampling: models.Sampling
    seed: int | None
    future: concurrent.futures.Future

    @property
    def alone(self) -> bool:
        return self.seed is not None and not self.sampling.greedy


@dataclasses.dataclass
class EngineStats:
    """Counters of the engine's work (read by `/get_server_info`)."""

    batches: int = 0
    rows: int = 0
    tokens: int = 0
    decode_seconds: float = 0.0
    accepted_length_sum: float = 0.0  # speculative decoding: sum over batches of the mean
    speculative_batches: int = 0
    cancelled_requests: int = 0  # requests abandoned before they ended (clients went away)

    def as_dict(self) -> dict[str, float]:
        mean_accept = (
            self.accepted_length_sum / self.speculative_batches
            if self.speculative_batches
            else None
        )
        return {
            "batches": self.batches,
            "rows": self.rows,
            "generated_tokens": self.tokens,
            "mean_batch_rows": self.rows / self.batches if self.batches else 0.0,
            "decode_seconds": round(self.decode_seconds, 3),
            "avg_spec_accept_length": mean_accept,
            "cancelled_requests": self.cancelled_requests,
        }


class EngineClosedError(RuntimeError):
    """The engine was closed, or its worker died; no request is accepted."""


class _Worker:
    """A thread that owns a model and serves a queue of work (`_serve`); closing it, or its
    death, fails every request not finished (`_fail_pending`)."""

    _queue: queue.Queue

    def _start(self) -> None:
        self._queue = queue.Queue()
        self._closed = False
        self._error: BaseException | None = None
        name = type(self).__name__
        self._thread = threading.Thread(target=self._guarded, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def _check_open(self) -> None:
        if not self.alive:
            name = type(self).__name__
            raise EngineClosedError(
                f"{name} is not running ({self._error!r})" if self._error else f"{name} is closed"
            )

    def close(self, timeout: float = 30.0) -> None:
        """Stops the worker after the batch or decode call in progress; every request not
        finished fails."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        name = type(self).__name__
        self._fail_pending(EngineClosedError(f"{name} closed before this request finished"))

    def _guarded(self) -> None:
        try:
            self._serve()
        except BaseException as err:  # noqa: BLE001 - recorded, and every waiter is told
            self._error = err
            name = type(self).__name__
            self._fail_pending(EngineClosedError(f"{name} worker died: {err!r}"))
            raise

    def _serve(self) -> None:
        raise NotImplementedError

    def _fail_pending(self, err: BaseException) -> None:
        raise NotImplementedError


class BatchEngine(_Worker):
    """Decodes submitted requests in batches on a worker thread (see the module docstring).

    Args:
        sampler: the `models.Sampler` (only the worker thread calls it).
        stop_tokens: token ids that end a row (e.g. `<|im_end|>` and the tokenizer's eos).
        max_rows: the most rows one call decodes (a request's `n` rows are never split).
        window_s: how long the worker waits for more requests after the first one, while the
            batch is smaller than the recent ones.
        seed: the base seed of unseeded requests (each batch draws a fresh key from it).
        share_prefix: rows sharing a leading run of tokens (one system prompt and tool list)
            prefill it once, rounded down to a multiple of this (0: never).
    """

    def __init__(
        self,
        sampler: models.Sampler,
        stop_tokens: Sequence[int],
        *,
        max_rows: int = 16,
        window_s: float = 0.02,
        seed: int = 0,
        share_prefix: int = 512,
    ):
        if max_rows < 1:
            raise ValueError(f"BatchEngine: max_rows={max_rows} must be >= 1")
        if window_s < 0:
            raise ValueError(f"BatchEngine: window_s={window_s} must be >= 0")
        self.sampler, self.stop_tokens = sampler, [int(t) for t in stop_tokens]
        self.max_rows, self.window_s, self.share_prefix = max_rows, window_s, share_prefix
        self.stats = EngineStats()
        self._seed, self._calls = seed, 0
        self._carry: _Job | None = None  # a request that did not fit the last batch
        # Rows of the recent batches: their largest is how many clients are likely active.
        self._recent: collections.deque[int] = collections.deque([1], maxlen=8)
        self._start()

    @property
    def max_length(self) -> int:
        return self.sampler.max_length

    @property
    def num_draft_tokens(self) -> int:
        return self.sampler.num_draft_tokens

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: models.Sampling,
        seed: int | None = None,
    ) -> concurrent.futures.Future:
        """Queues rows (one per prompt) that share settings; the future gives a `Completion`
        per row, or raises the sampler's error (e.g. a `ValueError` naming a bad row)."""
        self._check_open()
        if not prompts:
            raise ValueError("BatchEngine.submit: no prompts")
        future: concurrent.futures.Future = concurrent.futures.Future()
        job = _Job(
            [list(map(int, p)) for p in prompts], int(max_new_tokens), sampling, seed, future
        )
        self._queue.put(job)
        return future

    # The worker.

    def _serve(self) -> None:
        while True:
            first, self._carry = self._carry or self._queue.get(), None
            if first is None:
                return
            jobs, stop = self._gather(first)
            self._recent.append(sum(len(j.prompts) for j in jobs))
            for group in self._groups(jobs):
                self._decode(group)
            if stop:
                return

    def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """`first`, what is queued, and what arrives within the window while the batch is
        smaller than the recent ones; up to `max_rows` rows."""
        jobs, rows = [first], len(first.prompts)
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            wait = deadline - time.monotonic() if rows < max(self._recent) else 0.0
            try:
                job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            if rows + len(job.prompts) > self.max_rows:
                self._carry = job  # the next batch starts with it
                break
            jobs.append(job)
            rows += len(job.prompts)
        return jobs, False

    @staticmethod
    def _groups(jobs: list[_Job]) -> list[list[_Job]]:
        shared = [j for j in jobs if not j.alone]
        return ([shared] if shared else []) + [[j] for j in jobs if j.alone]

    def _decode(self, group: list[_Job]) -> None:
        live = [j for j in group if j.future.set_running_or_notify_cancel()]
        if not live:
            return
        prompts = [p for j in live for p in j.prompts]
        budgets = [j.max_new_tokens for j in live for _ in j.prompts]
        settings = [j.sampling for j in live for _ in j.prompts]
        fill = _power_of_two(len(prompts)) - len(prompts)
        prompts, budgets = prompts + [prompts[0]] * fill, budgets + [1] * fill
        settings = settings + [settings[0]] * fill
        if len(live) == 1 and live[0].alone:
            seed = live[0].seed
        else:
            seed = (self._seed * 1_000_003 + self._calls) & 0x7FFFFFFF
        self._calls += 1
        shared = 0
        if self.share_prefix and len(prompts) > 1:
            shared = models.shared_prefix_length(prompts, multiple=self.share_prefix)
        start = time.perf_counter()
        try:
            out = self.sampler(
                prompts,
                max_new_tokens=budgets,
                sampling=settings,
                stop_tokens=self.stop_tokens,
                seed=seed,
                shared_prefix=shared,
            )
        except Exception as err:  # noqa: BLE001 - the requests fail, the engine goes on
            for job in live:
                job.future.set_exception(err)
            return
        self._count(out, len(prompts) - fill, time.perf_counter() - start)
        row = 0
        for job in live:
            rows = []
            for _ in job.prompts:
                rows.append(Completion(tuple(out.completion(row)), bool(out.stopped[row])))
                row += 1
            job.future.set_result(rows)

    def warmup(
        self,
        prompt_tokens: Sequence[int],
        max_new_tokens: int,
        sampling: models.Sampling | None = None,
    ) -> int:
        """Compiles the programs of every batch size (1, 2, 4, ... up to `max_rows` rows) for
        prompts of these lengths and this completion limit, by decoding placeholder prompts
        through the engine; returns the number of calls made. Run it before serving."""
        calls = 0
        pad = getattr(self.sampler, "pad_id", 0)
        for length in prompt_tokens:
            for rows in _sizes(self.max_rows):
                job = [[pad] * length] * rows
                settings = sampling or models.Sampling()
                self.submit(job, max_new_tokens=max_new_tokens, sampling=settings).result()
                calls += 1
        return calls

    def _count(self, out: models.SampleOutput, rows: int, seconds: float) -> None:
        s = self.stats
        s.batches += 1
        s.rows += rows
        s.tokens += int(np.sum(out.lengths[:rows]))
        s.decode_seconds += seconds
        if out.acceptance_length is not None:
            s.accepted_length_sum += out.acceptance_length
            s.speculative_batches += 1

    def _fail_pending(self, err: BaseException) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None and not job.future.done():
                job.future.set_exception(err)


def _power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _sizes(max_rows: int) -> list[int]:
    """The batch sizes the engine decodes: powers of two up to the one holding `max_rows`."""
    return [1 << i for i in range(_power_of_two(max_rows).bit_length())]


_WAKE = object()  # queued to wake the slot engine's worker (a cancellation)


@dataclasses.dataclass
class _Call:
    """Work for the slot engine's worker thread (which owns the decoder)."""

    fn: Callable[[], object]
    future: concurrent.futures.Future

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except Exception as err:  # noqa: BLE001 - the caller gets it
            self.future.set_exception(err)


@dataclasses.dataclass
class _Row:
    """One row of a request in flight in the slot engine."""

    job: _SlotJob
    index: int
    tokens: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _SlotJob:
    prompts: list[list[int]]
    max_new_tokens: int
    sampling: models.Sampling
    seeds: list[int]
    future: concurrent.futures.Future
    on_tokens: Callable[[int, list[int]], None] | None
    results: list[Completion | None] = dataclasses.field(default_factory=list)
    admitted: int = 0  # rows given a slot so far

    def __post_init__(self):
        self.results = [None] * len(self.prompts)


class SlotEngine(_Worker):
    """Continuous batching over a `models.SlotDecoder`, with the `BatchEngine`'s interface.

    One worker thread owns the decoder. Between decode steps it admits queued rows into the
    free slots (a request's `n` rows each take a slot; rows of a request may start at
    different steps), then steps every busy slot once, hands each row's new token to the
    request's `on_tokens` callback (the server streams it) and retires rows that end, so a
    request that arrives mid-decode starts at the next step instead of waiting for a batch,
    and a short answer leaves without waiting for the longest one.

    Each row samples with its own seed (`SlotDecoder`: the k-th token from
    `fold_in(key(seed), k)`), so a seeded request gives the same completion whatever else
    is decoding, and needs no call of its own. Unseeded rows draw fresh seeds from `seed`.

    Args:
        decoder: the `models.SlotDecoder` (its slots are the most rows in flight; its stop
            tokens end rows).
        seed: the base seed of unseeded requests.
    """

    def __init__(self, decoder: models.SlotDecoder, *, seed: int = 0):
        self.decoder = decoder
        self.stats = EngineStats()
        self._seed, self._drawn = seed, 0
        self._waiting: collections.deque[_SlotJob] = collections.deque()
        self._slots: dict[int, _Row] = {}
        self._cancelled: set[int] = set()  # ids of futures whose requests were abandoned
        self._lock = threading.Lock()
        self._start()

    @property
    def max_length(self) -> int:
        return self.decoder.max_length

    @property
    def max_rows(self) -> int:
        return self.decoder.slots

    @property
    def num_draft_tokens(self) -> int:
        return 0

    def submit(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: models.Sampling,
        seed: int | None = None,
        on_tokens: Callable[[int, list[int]], None] | None = None,
    ) -> concurrent.futures.Future:
        """Queues rows (one per prompt) that share settings; the future gives a `Completion`
        per row, or raises the decoder's error (e.g. a `ValueError` naming a bad row).
        `on_tokens(row, token_ids)` is called on the worker thread as each row's tokens are
        decoded (keep it short: it runs between decode steps; if it raises, the request
        fails with its error). Cancelling the future frees
        the request's slots at the next step."""
        self._check_open()
        if not prompts:
            raise ValueError("SlotEngine.submit: no prompts")
        rows = [list(map(int, p)) for p in prompts]
        if seed is None:
            seeds = [None] * len(rows)
        else:  # row j of a seeded request: its own stream, the same on every call
            seeds = [int(seed) if j == 0 else (int(seed) * 1_000_003 + j) & 0x7FFFFFFF
                     for j in range(len(rows))]  # fmt: skip
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_SlotJob(rows, int(max_new_tokens), sampling, seeds, future, on_tokens))
        return future

    def cancel(self, future: concurrent.futures.Future) -> None:
        """Abandons the request of `future` (e.g. its client went away): its rows leave their
        slots at the next step and the future is cancelled-with-error."""
        with self._lock:
            self._cancelled.add(id(future))
        if future.cancel():  # still queued
            return
        self._queue.put_nowait(_WAKE)

    def warmup(
        self,
        prompt_tokens: Sequence[int],
        max_new_tokens: int,
        sampling: models.Sampling | None = None,
    ) -> int:
        """Compiles, on the worker thread, admission for prompts of these lengths and every
        decode program such requests can need (`SlotDecoder.warmup`); returns the number of
        programs compiled. Run it before serving (every slot must be free)."""
        self._check_open()
        future: concurrent.futures.Future = concurrent.futures.Future()
        settings = sampling or models.Sampling()
        self._queue.put(_Call(lambda: self.decoder.warmup(prompt_tokens, max_new_tokens,
                                                          settings), future))  # fmt: skip
        return future.result()

    # The worker.

    def _serve(self) -> None:
        while True:
            idle = not self._slots and not self._waiting
            if idle and not self._take(self._queue.get()):  # idle: block until work arrives
                return
            if not self._drain():
                return
            self._drop_cancelled()
            self._admit()
            if self._slots:
                self._step()

    def _take(self, item) -> bool:
        """Handles one queue item (a request, work for this thread, a wake-up); False for
        the close sentinel."""
        if item is None:
            return False
        if isinstance(item, _Call):
            item.run()
        elif item is not _WAKE:
            self._waiting.append(item)
        return True

    def _drain(self) -> bool:
        """Takes every queued item without waiting; False once closing."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if not self._take(item):
                return False

    def _drop_cancelled(self) -> None:
        with self._lock:
            gone, self._cancelled = self._cancelled, set()
        if not gone:
            return
        jobs = {id(r.job): r.job for r in self._slots.values()}
        jobs.update({id(j): j for j in self._waiting})
        for job in jobs.values():
            if id(job.future) in gone:
                self.stats.cancelled_requests += 1
                self._fail_job(job, concurrent.futures.CancelledError("request cancelled"))
        self._waiting = collections.deque(j for j in self._waiting if not j.future.done())

    def _admit(self) -> None:
        for slot in self.decoder.free_slots():
            if not self._waiting:
                return
            job = self._waiting[0]
            if job.admitted == 0 and not job.future.set_running_or_notify_cancel():
                self._waiting.popleft()
                continue
            j = job.admitted
            job.admitted += 1
            if job.admitted == len(job.prompts):
                self._waiting.popleft()
            seed = job.seeds[j]
            if seed is None:
                seed = (self._seed * 1_000_003 + self._drawn) & 0x7FFFFFFF
                self._drawn += 1
            start = time.perf_counter()
            try:
                first = self.decoder.admit(slot, job.prompts[j], max_new_tokens=job.max_new_tokens,
                                           sampling=job.sampling, seed=seed)  # fmt: skip
            except (ValueError, TypeError) as err:  # the request fails, the engine goes on
                self._fail_job(job, err)
                continue
            self.stats.decode_seconds += time.perf_counter() - start
            row = _Row(job, j)
            self._emit(row, first.tokens_of(0))
            if first.finished[0]:
                self._finish(row, bool(first.stopped[0]))
            elif job.future.done():  # failed by its listener
                self.decoder.cancel(slot)
            else:
                self._slots[slot] = row

    def _step(self) -> None:
        start = time.perf_counter()
        out = self.decoder.step()
        self.stats.decode_seconds += time.perf_counter() - start
        self.stats.batches += 1  # a decode call: its rows are the slots that emitted
        self.stats.rows += int(np.sum(out.emitted.any(1)))
        for slot in np.flatnonzero(out.emitted.any(1)):
            row = self._slots.get(int(slot))
            if row is None:
                continue
            self._emit(row, out.tokens_of(int(slot)))
            if out.finished[slot]:
                self._slots.pop(int(slot), None)
                self._finish(row, bool(out.stopped[slot]))

    def _emit(self, row: _Row, tokens: list[int]) -> None:
        row.tokens.extend(tokens)
        self.stats.tokens += len(tokens)
        if row.job.on_tokens is not None and not row.job.future.done():
            try:
                row.job.on_tokens(row.index, tokens)
            except Exception as err:  # noqa: BLE001 - the request fails, the engine goes on
                self._fail_job(row.job, err)

    def _finish(self, row: _Row, stopped: bool) -> None:
        job = row.job
        job.results[row.index] = Completion(tuple(row.tokens), stopped)
        if all(r is not None for r in job.results) and not job.future.done():
            job.future.set_result(list(job.results))

    def _fail_job(self, job: _SlotJob, err: BaseException) -> None:
        if job in self._waiting:
            self._waiting.remove(job)
        for slot, row in list(self._slots.items()):
            if row.job is job:
                self.decoder.cancel(slot)
                del self._slots[slot]
        if not job.future.done():
            job.future.set_exception(err)

    def _fail_pending(self, err: BaseException) -> None:
        jobs = [row.job for row in self._slots.values()] + list(self._waiting)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, _Call):
                job.future.set_exception(err)
            elif job is not None and job is not _WAKE:
                jobs.append(job)
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(err)
