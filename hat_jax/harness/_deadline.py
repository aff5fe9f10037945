"""Run a blocking call with a deadline on a reusable daemon worker thread.

The loop must stop waiting for a slow policy or tool without being able to interrupt it (a
blocking HTTP request, a JAX computation). The call keeps running on its worker, which returns
to the idle pool when it finishes; its result is discarded. Workers are daemon threads, so a
hung call never blocks interpreter exit. Hand-offs use C-level `SimpleQueue`s (no Python-level
condition variables) to keep the per-call cost in the tens of microseconds.

Callables that only compute in memory (catalog lookups, the rule-based policy) can be declared
inline: they run on the caller's thread with the deadline checked afterwards, which saves two
thread wake-ups per call. Anything that may block (network, subprocess, accelerator) must not.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class DeadlineExceeded(TimeoutError):
    """The call did not finish within its time limit."""


_idle: list[queue.SimpleQueue] = []
_lock = threading.Lock()


def _worker(inbox: queue.SimpleQueue) -> None:
    while True:
        fn, outbox = inbox.get()
        start = time.perf_counter()
        try:
            result = (fn(), None)
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            result = (None, err)
        outbox.put((*result, start, time.perf_counter()))
        fn = outbox = result = None
        with _lock:
            _idle.append(inbox)


class Pending:
    """A call running on a worker; `wait` collects it (once)."""

    __slots__ = ("_outbox",)

    def __init__(self, outbox: queue.SimpleQueue):
        self._outbox = outbox

    def wait(self, timeout_s: float) -> tuple[Any, float, float]:
        """Returns `(value, start, end)` (`perf_counter` times of the call itself).

        Raises:
          DeadlineExceeded: no result within `timeout_s` (the call keeps running detached).
          Exception: whatever the call raised.
        """
        try:
            value, error, start, end = self._outbox.get(timeout=max(timeout_s, 1e-6))
        except queue.Empty:
            raise DeadlineExceeded(f"no result within {timeout_s:.3g} s") from None
        if error is not None:
            raise error
        return value, start, end


def submit(fn: Callable[[], Any]) -> Pending:
    """Starts `fn()` on an idle worker (a new one if none is idle)."""
    with _lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_worker, args=(inbox,), daemon=True, name="harness-call").start()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    inbox.put((fn, outbox))
    return Pending(outbox)


class Completed:
    """A call already run on the caller's thread (for callables declared inline: pure
    in-process computation that cannot block). Same `wait` contract as `Pending` (the result is
    ready, so `wait` returns at once); callers compare `(start, end)` with their deadline."""

    __slots__ = ("_value", "_error", "_start", "_end")

    def __init__(self, fn: Callable[[], Any]):
        self._start = time.perf_counter()
        try:
            self._value, self._error = fn(), None
        except Exception as err:  # noqa: BLE001 - handed to the caller by `wait`
            self._value, self._error = None, err
        self._end = time.perf_counter()

    def wait(self, timeout_s: float) -> tuple[Any, float, float]:
        del timeout_s  # already finished
        if self._error is not None:
            raise self._error
        return self._value, self._start, self._end


def start(fn: Callable[[], Any], *, inline: bool = False) -> Pending | Completed:
    """`Completed(fn)` for inline callables, else `submit(fn)`."""
    return Completed(fn) if inline else submit(fn)


def call_with_deadline(
    fn: Callable[[], Any], timeout_s: float, *, inline: bool = False
) -> tuple[Any, float]:
    """Runs `fn()` (on a worker unless `inline`); returns `(value, seconds fn itself ran)`.

    Raises:
      DeadlineExceeded: `fn` did not finish within `timeout_s` (a worker call keeps running
        detached; an inline call's late result is discarded).
      Exception: whatever `fn` raised.
    """
    value, begin, end = start(fn, inline=inline).wait(timeout_s)
    if end - begin > timeout_s:  # only possible inline: the late result is discarded
        raise DeadlineExceeded(f"took {end - begin:.3g} s, limit {timeout_s:.3g} s")
    return value, end - begin


def covered(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of `(start, end)` intervals (time spent in parallel calls)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
