"""Keep freed host memory in the process, so a CPU step does not page-fault its buffers back in.

XLA on CPU allocates an executable's temporaries and outputs with `malloc` on every call.
glibc serves blocks above its mmap threshold (and blocks of the per-thread arenas) with
fresh pages that go back to the kernel when freed, so every step touches its whole working
set as new pages: on the bench model (`bench/bench_model.py`, a 2 s training step) that is
about 360,000 page faults and 1 s of kernel time per step, a third of the CPU time.

`retain_freed_memory()` tells glibc's allocator to keep what it frees: one arena (M_ARENA_MAX
1), no mmap'd blocks (M_MMAP_MAX 0) and no trimming of the heap (M_TRIM_THRESHOLD at its
maximum). Freed blocks are then reused by later steps: once the heap has settled (a few
steps), most run without faults. The cost: the process's resident memory stays at its peak,
and threads share one malloc arena. It only affects allocations made after the call, so the
launch scripts call it first thing and every training stage's driver (`hat_jax.train.
StageDriver`) when it is built, on the CPU backend only (accelerator buffers do not come
from malloc). It does nothing where the C library is not glibc (macOS, musl).

Controlled by the environment variable HAT_JAX_RETAIN_HOST_MEMORY: "1" always, "0" never,
unset or "auto" on JAX's CPU backend only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_NEVER = -1  # read as size_t by glibc: SIZE_MAX, never trim
ENV = "HAT_JAX_RETAIN_HOST_MEMORY"


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def retain_freed_memory(enable: bool | None = None) -> bool:
    """Make glibc keep freed memory for reuse; returns whether the settings are in effect.

    Args:
        enable: True or False to decide here; None reads HAT_JAX_RETAIN_HOST_MEMORY ("1",
            "0", or "auto"/unset: only when JAX's default backend is the CPU).

    Raises:
        ValueError: HAT_JAX_RETAIN_HOST_MEMORY holds anything else.
    """
    if enable is None:
        value = os.environ.get(ENV, "auto").strip().lower()
        if value not in ("1", "0", "auto", ""):
            raise ValueError(f"{ENV} must be 1, 0 or auto, got {value!r}")
        if value in ("auto", ""):
            import jax  # the backend is initialised here: call after jax.distributed.initialize

            enable = jax.default_backend() == "cpu"
        else:
            enable = value == "1"
    libc = _glibc()
    if not enable or libc is None:
        return False
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER))
    return all(libc.mallopt(option, value) == 1 for option, value in settings)
