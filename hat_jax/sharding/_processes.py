"""Host data across the processes of a multi-process job.

On-policy stages sample with weights spread over every process's devices, so every process
must call the sampler with the same prompts (it is one program across the job). The pattern:

    prompts = all_process_rows(local_prompts)   # every process's rows, in process order
    out = sampler(prompts, ...)                 # the same call on every process
    rows = process_rows(out_rows)               # this process's rows of the global batch

`process_rows` takes the consecutive share `global_batch` expects (process i holds rows
[i * n / p, (i + 1) * n / p)), so the global batch equals the one a single process would
build. `to_host` fetches device arrays whole even when they span other processes' devices,
and `check_same_on_all_processes` turns a silent divergence (a collective of mismatched
shapes aborts, or hangs) into an error naming the processes that differ. With one process all
four are plain host operations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np


def to_host(tree: Any) -> Any:
    """`jax.device_get` that also fetches arrays spread over several processes' devices
    (every process gets the whole value; a collective when any array is not addressable
    here, so every process must call it)."""
    from jax.experimental import multihost_utils

    def fetch(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(fetch, tree)


def all_process_rows(local: Any) -> Any:
    """Every process's rows (a pytree of host arrays, leading axis = rows), concatenated in
    process order; with one process, `local` as numpy arrays. Every process must pass the
    same structure and row count (a collective)."""
    local = jax.tree.map(np.asarray, local)
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(local, tiled=True))


def process_rows(rows: Any, *, what: str = "rows") -> Any:
    """This process's consecutive share of rows every process holds in full (a pytree of
    arrays with the same leading size); `rows` itself with one process.

    Raises:
      ValueError: the row count does not divide by the process count.
    """
    count = jax.process_count()
    if count == 1:
        return rows
    sizes = {len(x) for x in jax.tree.leaves(rows)}
    if len(sizes) != 1:
        raise ValueError(f"process_rows: {what} have different row counts {sorted(sizes)}")
    (n,) = sizes
    if n % count:
        raise ValueError(f"process_rows: {n} {what} do not split over {count} processes")
    share, i = n // count, jax.process_index()
    return jax.tree.map(lambda x: x[i * share : (i + 1) * share], rows)


def fingerprint(arrays: Iterable[Any]) -> bytes:
    """A 16-byte digest of arrays' shapes, dtypes and values."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.digest()


def check_same_on_all_processes(arrays: Iterable[Any], what: str) -> None:
    """Raises RuntimeError naming the processes whose `arrays` differ from process 0's (a
    collective; nothing with one process)."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.frombuffer(fingerprint(arrays), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine))
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise RuntimeError(
            f"{what} differ between processes: processes {differ} hold other values than "
            "process 0. Every process must make this call with the same inputs (e.g. gather "
            "the prompts with hat_jax.sharding.all_process_rows; a wall-clock limit that "
            "binds on one host and not another makes replicated rollouts diverge)"
        )
