"""Data shards: the records split into streams whose rows do not depend on the process count.

A pipeline splits its records into `n` data shards (shard `s` reads records `s, s + n, ...`).
Each shard shuffles, prepares and packs on its own and contributes `global batch / n` rows to
every step, and the shards are laid out in order along the batch: the global batch is the
same whether one process reads all shards or `k` processes read `n / k` consecutive shards
each. So a run gives the same losses on 1, 2, 4 ... processes, and a checkpoint's data
position (one state per shard) restores into any process count that divides `n`.

`n` defaults to `gcd(global batch, DEFAULT_SHARDS)`: runs on 1, 2, 4 or 8 processes (as the
batch allows) read the same batches. A run with more processes, or a process count that does
not divide that, gets one shard per process (its batches then depend on the process count);
set the shard count explicitly to a multiple of every process count you will use.
"""

from __future__ import annotations

import math

DEFAULT_SHARDS = 8


def resolve_shards(requested: int, global_batch_size: int, process_count: int) -> int:
    """The number of data shards (`requested`, or the default when 0).

    Raises:
      ValueError: naming the setting, when the shard count does not divide the global batch or
        is not a multiple of the process count.
    """
    if requested < 0:
        raise ValueError(f"data_shards must be >= 0 (0: the default), got {requested}")
    if global_batch_size % process_count:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not divisible by {process_count} processes"
        )
    shards = requested
    if not shards:
        shards = math.gcd(global_batch_size, DEFAULT_SHARDS)
        if shards % process_count:
            shards = process_count
    if global_batch_size % shards:
        raise ValueError(
            f"data_shards={shards} does not divide global_batch_size {global_batch_size}: each "
            "data shard contributes the same number of rows to every batch"
        )
    if shards % process_count:
        raise ValueError(
            f"data_shards={shards} is not a multiple of the {process_count} processes: each "
            "process reads whole data shards"
        )
    return shards


def owned_shards(shards: int, process_index: int, process_count: int) -> range:
    """The consecutive data shards process `process_index` reads (their rows are its rows of
    the global batch, in order)."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is not in [0, {process_count})")
    per = shards // process_count
    return range(process_index * per, (process_index + 1) * per)


def shard_of(ds, shard: int, shards: int, *, seed: int, shuffle: bool, what: str = "records"):
    """Data shard `shard`'s elements of a Grain `MapDataset` (`shard, shard + shards, ...`),
    shuffled with the shard's own seed when `shuffle`, and how many there are.

    Raises:
      ValueError: the shard is empty (more shards than elements).
    """
    part = ds[shard::shards]
    if len(part) == 0:
        raise ValueError(
            f"data shard {shard} of {shards} has no {what} ({len(ds)} in all): use fewer data "
            f"shards (data_shards) or more {what}"
        )
    return (part.shuffle(seed=shard_seed(seed, shard)) if shuffle else part), len(part)


def shard_seed(seed: int, shard: int) -> int:
    """A seed for shard `shard`'s own shuffles (shard 0 keeps `seed`)."""
    return (seed + 0x9E3779B1 * shard) % 2**32
