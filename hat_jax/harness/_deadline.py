"""Run a blocking call with a deadline on a reusable daemon worker thread.

The loop must stop waiting for a slow policy or tool without being able to interrupt it (a
blocking HTTP request, a JAX computation). The call keeps running on its worker, which returns
to the idle pool when it finishes; its result is discarded. Workers are daemon threads, so a
hung call never blocks interpreter exit.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class DeadlineExceeded(TimeoutError):
    """The call did not finish within its time limit."""


class _Job:
    __slots__ = ("fn", "done", "value", "error", "elapsed")

    def __init__(self, fn: Callable[[], Any]):
        self.fn, self.done = fn, threading.Event()
        self.value = self.error = None
        self.elapsed = 0.0


_idle: list[queue.SimpleQueue] = []
_lock = threading.Lock()


def _worker(inbox: queue.SimpleQueue) -> None:
    while True:
        job: _Job = inbox.get()
        start = time.perf_counter()
        try:
            job.value = job.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            job.error = err
        job.elapsed = time.perf_counter() - start
        job.done.set()
        job = None
        with _lock:
            _idle.append(inbox)


def call_with_deadline(fn: Callable[[], Any], timeout_s: float) -> tuple[Any, float]:
    """Runs `fn()` on a worker; returns `(value, seconds fn itself ran)`.

    Raises:
      DeadlineExceeded: `fn` did not finish within `timeout_s` (it keeps running detached).
      Exception: whatever `fn` raised.
    """
    job = _Job(fn)
    with _lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_worker, args=(inbox,), daemon=True, name="harness-call").start()
    inbox.put(job)
    if not job.done.wait(max(timeout_s, 0.0)):
        raise DeadlineExceeded(f"no result within {timeout_s:.3g} s")
    if job.error is not None:
        raise job.error
    return job.value, job.elapsed
