# Over 400 lines: the transforms form one chain whose order is the contract.
"""The Grain pipeline that feeds SFT: records -> packed, batched, per-process token rows.

    source (ArrayRecord / JSONL)  ─► this process's records ─► shuffle (per epoch) ─► repeat
      ─► prepare [worker processes optional]: decode, optional online HSA re-render under a
         fresh augmentation, split into rows, render (chat format, loss mask), truncate
      ─► rows + bookkeeping (main process)  ─► first-fit pack (segment ids, positions)
      ─► batch ─► `DataIterator` (get_state / set_state, stats)

Each stage is a pure function under a thin Grain transform (`data._examples.prepare` does the
work). Batches are exactly what `hat_jax.train` consumes (`hat_jax.train.DataSource`): the
process-local rows of the global batch, each key int32 `[b, seq_len]`:

- `input_ids`: token ids; padding is the tokenizer's pad token.
- `loss_mask`: 1 on tokens the assistant produced (the trainer predicts token t+1 from t and
  learns where `loss_mask[t+1]` is 1 within one segment).
- `segment_ids`: 1, 2, ... per packed conversation within a row, 0 on padding.
- `positions`: position within its conversation, restarting at 0.

Determinism: every random choice (shuffle order per epoch, online augmentation, bin order)
derives from `seed` and the element's index, so the same config gives the same batches, with or
without worker processes. `get_state()` (JSON) taken after a batch and given to `set_state()`
on a fresh iterator continues with exactly the batches an uninterrupted run would produce; the
trainer saves it with each checkpoint.

Multi-host: the records are split into data shards (`data._shards`), each shuffled, prepared
and packed on its own; a process reads consecutive shards and its rows of the global batch
are theirs. The global batch depends on the shard count, not on the process count, so 1, 2
or 4 processes train on the same batches and resume each other's checkpoints. With
`num_epochs=None` (the default) the stream never ends and the trainer stops at its step count;
with a finite epoch count, the stream ends when the first shard runs out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from data._accounting import RowsIterDataset
from data._examples import Augmenter, RenderOptions, prepare
from data._instructions import Instruction
from data._iterator import DataIterator
from data._prompts import PreparePrompt
from data._shards import owned_shards, resolve_shards, shard_of, shard_seed
from data._sources import open_source


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnlineHSAConfig:
    """Online Harness-State Augmentation of stored trajectories.

    Attributes:
      probability: chance per record and epoch of re-rendering under a fresh augmentation
        (0 = off; records without a stored trajectory are always rendered as stored).
      dims: the HSA dimensions to draw from (None = `hat_jax.hsa`'s default). Numeric prompt
        constraints are pinned to the trajectory's, whatever the dimensions.
      strength: HSA strength.
      opaque_names: the probability that a rename draws an opaque name (`tool_3f9a`,
        `skill-07c2`) the policy can only copy from the tool list or the Skill index, never
        memorise (None: `hat_jax.hsa.augment`'s default, 0.15 x strength).
      harness_dir: the base Harness (None: the released Harness of the room the corpus
        manifests record, `livestream.room(...)`; Harness v0 for corpora that record none).
    """

    probability: float = 0.0
    dims: tuple[str, ...] | None = None
    strength: float = 1.0
    opaque_names: float | None = None
    harness_dir: str | None = None

    def __post_init__(self):
        if self.opaque_names is not None and not 0.0 <= self.opaque_names <= 1.0:
            raise ValueError(f"online HSA opaque_names must be in [0, 1], got {self.opaque_names}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """The SFT data pipeline.

    Attributes:
      sources: record files or corpus directories (see `split`).
      split: in a corpus directory, read `<split>-*.array_record` (or `<split>.jsonl`).
      seq_len: packed row length.
      global_batch_size: rows per step over all processes.
      seed: the one seed every random choice derives from.
      shuffle: shuffle records (differently each epoch).
      num_epochs: passes over the data; None repeats forever.
      truncation: "drop" or "right" for rows longer than `seq_len` (`data._examples`).
      enable_thinking, preserve_thinking: render options (see `hat_jax.chat_format`).
      pack_bins: rows packed at once by first-fit in each data shard (None: max(the shard's
        rows per batch, 16)); more bins, less padding.
      shuffle_bins: shuffle the rows of each packed group (seeded).
      worker_count: worker processes for decoding and rendering, per JAX process, divided
        among its data shards (at least one each; 0 = in this process).
      worker_buffer_size: prepared records buffered per worker.
      read_threads: threads preparing records when there are no workers.
      online_hsa: online augmentation of stored trajectories.
      bare_probability: chance per record and epoch that a record of the original Harness
        state renders without its system prompt and tool schemas (`RenderOptions`; 0 = off).
      tokenizer_dir: a Hugging Face tokenizer directory (None = the demo tokenizer).
      data_shards: independent streams the records are split into (0: the default of
        `data._shards.resolve_shards`); the global batch depends on it, not on the number
        of processes, which must divide it.
    """

    sources: tuple[str, ...]
    split: str | None = None
    seq_len: int
    global_batch_size: int
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    truncation: str = "drop"
    enable_thinking: bool = True
    preserve_thinking: bool = False
    pack_bins: int | None = None
    shuffle_bins: bool = True
    worker_count: int = 0
    worker_buffer_size: int = 8
    read_threads: int = 1
    online_hsa: OnlineHSAConfig = OnlineHSAConfig()
    bare_probability: float = 0.0
    tokenizer_dir: str | None = None
    data_shards: int = 0

    def __post_init__(self):
        if isinstance(self.sources, str | os.PathLike):
            object.__setattr__(self, "sources", (str(self.sources),))
        object.__setattr__(self, "sources", tuple(str(s) for s in self.sources))
        if not self.sources:
            raise ValueError("PipelineConfig.sources is empty")
        if self.global_batch_size < 1:
            raise ValueError(f"global_batch_size must be positive, got {self.global_batch_size}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"num_epochs must be positive or None, got {self.num_epochs}")
        if self.data_shards < 0:
            raise ValueError(f"data_shards must be >= 0 (0: the default), got {self.data_shards}")
        self.render_options()  # validates seq_len, truncation, probability

    def render_options(self) -> RenderOptions:
        return RenderOptions(
            seq_len=self.seq_len,
            truncation=self.truncation,
            enable_thinking=self.enable_thinking,
            preserve_thinking=self.preserve_thinking,
            hsa_probability=self.online_hsa.probability,
            bare_probability=self.bare_probability,
        )


def corpus_room(sources: Sequence[str], split: str) -> str:
    """The live room the corpus directories among `sources` were generated in (their
    `<split>.manifest.json`; "v0" where a manifest records none). Mixed rooms are refused."""
    rooms = set()
    for src in sources:
        manifest = pathlib.Path(src) / f"{split}.manifest.json"
        if manifest.is_file():
            rooms.add(json.loads(manifest.read_text(encoding="utf-8")).get("room", "v0"))
    if len(rooms) > 1:
        raise ValueError(f"the corpora {list(sources)} come from different live rooms {rooms}")
    return rooms.pop() if rooms else "v0"


def make_augmenter(
    config: OnlineHSAConfig, *, sources: Sequence[str] = (), split: str = "train"
) -> Augmenter:
    """Fresh augmentations of the base Harness by `hat_jax.hsa.augment`: `config.harness_dir`,
    else the released Harness of the corpus's room (`corpus_room(sources, split)`)."""
    from hat_jax import harness as hx
    from hat_jax import livestream

    directory = config.harness_dir or livestream.room(corpus_room(sources, split)).harness_dir
    return HsaAugmenter(
        hx.load(directory),
        dims=config.dims,
        strength=config.strength,
        opaque_names=config.opaque_names,
    )


class HsaAugmenter:
    """`(rng, skills) -> HarnessState`: a fresh `hsa.augment` draw of `base` that keeps the
    canonical Skills the stored behaviour loads. `base_version` lets the pipeline refuse
    records generated from another Harness. Picklable (worker processes)."""

    def __init__(
        self,
        base,
        *,
        dims: tuple[str, ...] | None = None,
        strength: float = 1.0,
        opaque_names: float | None = None,
    ):
        self.base, self.dims, self.strength = base, dims, strength
        self.opaque_names = opaque_names
        self.base_version = base.version

    def __call__(self, rng: np.random.Generator, skills: frozenset[str]):
        from hat_jax import hsa

        kwargs: dict[str, Any] = {"strength": self.strength, "opaque_names": self.opaque_names}
        if self.dims is not None:
            kwargs["dims"] = tuple(self.dims)
        seed = int(rng.integers(2**31 - 1))
        return hsa.augment(self.base, seed=seed, preserve=hsa.Preserve(skills=skills), **kwargs)


class _Prepare:
    """`(location, raw)` at stream index i of data shard `shard` -> `(location, Prepared)`;
    picklable for workers."""

    def __init__(
        self, tokenizer, options: RenderOptions, seed: int, augmenter: Augmenter | None, shard=0
    ):
        self.tokenizer, self.options, self.augmenter = tokenizer, options, augmenter
        self.seed, self.shard = seed, shard

    def __call__(self, index: int, item: tuple[str, Any]):
        location, raw = item
        rng = np.random.default_rng([self.seed, 0x5EED, self.shard, index])
        prepared = prepare(
            raw,
            record_id=location,
            tokenizer=self.tokenizer,
            options=self.options,
            rng=rng,
            augmenter=self.augmenter,
        )
        return location, prepared


class _Locate:
    """`raw` at source index i -> `(location, raw)` (indices past the end wrap, as in Grain)."""

    def __init__(self, source: Any):
        self.source, self.size = source, len(source)

    def __call__(self, index: int, raw: Any) -> tuple[str, Any]:
        i = index % self.size
        locate = getattr(self.source, "location", None)
        return (locate(i) if locate else f"record {i}"), raw


def _packed_to_batch_row(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        "input_ids": packed["input_ids"].astype(np.int32),
        "loss_mask": packed["loss_mask"].astype(np.int32),
        "segment_ids": packed["input_ids_segment_ids"].astype(np.int32),
        "positions": packed["input_ids_positions"].astype(np.int32),
    }


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's padding id (`<|endoftext|>` for Qwen tokenizers)."""
    value = getattr(tokenizer, "pad_token_id", None)
    if value is None and hasattr(tokenizer, "token_to_id"):
        value = tokenizer.token_to_id("<|endoftext|>")
    if value is None:
        raise ValueError("the tokenizer has no pad token and no <|endoftext|> token")
    return int(value)


def build_sft_dataset(
    config: PipelineConfig,
    *,
    tokenizer: Any,
    source: Any | None = None,
    augmenter: Augmenter | None = None,
    shard: int = 0,
    shards: int = 1,
    workers: int | None = None,
) -> grain.IterDataset:
    """The Grain dataset of one data shard's batches (`sft_data` reads this process's shards).

    Args:
      config: the pipeline config.
      tokenizer: what `hat_jax.chat_format.render_tokens` accepts.
      source: a random-access source of records (default: `config.sources`).
      augmenter: fresh Harness states for online HSA (default: from `config.online_hsa`).
      shard, shards: this data shard (it reads records `shard, shard + shards, ...`) and the
        shard count; each batch holds `global_batch_size / shards` rows.
      workers: worker processes for this shard (default `config.worker_count`).
    """
    if config.global_batch_size % shards or not 0 <= shard < shards:
        raise ValueError(
            f"data shard {shard} of {shards}: the shard count must divide global_batch_size "
            f"{config.global_batch_size}"
        )
    rows_per_batch = config.global_batch_size // shards
    workers = config.worker_count if workers is None else workers
    source = source if source is not None else open_source(config.sources, config.split)
    if augmenter is None and config.online_hsa.probability > 0:
        augmenter = make_augmenter(config.online_hsa, sources=config.sources, split=config.split)
    ds = grain.MapDataset.source(source).map_with_index(_Locate(source))
    ds, records_per_epoch = shard_of(ds, shard, shards, seed=config.seed, shuffle=config.shuffle)
    ds = ds.repeat(config.num_epochs)
    prep = _Prepare(tokenizer, config.render_options(), config.seed, augmenter, shard)
    ds = ds.map_with_index(prep)
    read = grain.ReadOptions(num_threads=config.read_threads, prefetch_buffer_size=64)
    it = ds.to_iter_dataset(read)
    if workers > 0:
        _ensure_flags_parsed()
        it = it.mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=workers, per_worker_buffer_size=config.worker_buffer_size
            )
        )
    rows = RowsIterDataset(it, max_barren=records_per_epoch)
    length = {"input_ids": config.seq_len, "loss_mask": config.seq_len}
    packed = grain.experimental.FirstFitPackIterDataset(
        rows,
        length_struct=length,
        num_packing_bins=config.pack_bins or max(rows_per_batch, 16),
        seed=shard_seed(config.seed, shard),
        shuffle_bins=config.shuffle_bins,
        padding_struct={"input_ids": pad_id(tokenizer), "loss_mask": 0},
    )
    return packed.map(_packed_to_batch_row).batch(rows_per_batch, drop_remainder=True)


def _ensure_flags_parsed() -> None:
    """Grain's worker processes read absl flags; outside an absl main, use their defaults."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _fingerprint(config: PipelineConfig, shards: int, workers: int) -> str:
    """Identifies what a saved state is a position in: the data config and shard count, not
    the process count. The workers per shard are part of it: a state of a pipeline with worker
    processes has their layout (Grain cannot re-slice it)."""
    keys = dict(
        sources=config.sources,
        split=config.split,
        seq_len=config.seq_len,
        batch=config.global_batch_size,
        seed=config.seed,
        shuffle=config.shuffle,
        epochs=config.num_epochs,
        truncation=config.truncation,
        thinking=(config.enable_thinking, config.preserve_thinking),
        bins=(config.pack_bins, config.shuffle_bins),
        hsa=dataclasses.asdict(config.online_hsa),
        **({"bare": config.bare_probability} if config.bare_probability else {}),
        shards=shards,
        workers=workers,
    )
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _sft_measure(batch) -> dict[str, int]:
    return {
        "slots": batch["input_ids"].size,
        "tokens": np.count_nonzero(batch["segment_ids"]),
        "target_tokens": np.count_nonzero(batch["loss_mask"]),
    }


def sft_data(
    config: PipelineConfig,
    *,
    tokenizer: Any | None = None,
    source: Any | None = None,
    augmenter: Augmenter | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
) -> DataIterator:
    """The SFT batch iterator for this JAX process (a `hat_jax.train.DataSource`).

    `tokenizer` defaults to `config.tokenizer_dir` (or the demo tokenizer); process index and
    count default to JAX's. The process reads its consecutive data shards. `stats()` adds batches, slots, tokens (non-padding), target
    tokens and the padding fraction to the record counts.
    """
    tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(config.tokenizer_dir)
    process_index, process_count = _process(process_index, process_count)
    shards = resolve_shards(config.data_shards, config.global_batch_size, process_count)
    owned = owned_shards(shards, process_index, process_count)
    workers = -(-config.worker_count // len(owned)) if config.worker_count else 0
    source = source if source is not None else open_source(config.sources, config.split)
    if augmenter is None and config.online_hsa.probability > 0:
        augmenter = make_augmenter(config.online_hsa, sources=config.sources, split=config.split)
    datasets = {
        s: build_sft_dataset(
            config,
            tokenizer=tokenizer,
            source=source,
            augmenter=augmenter,
            shard=s,
            shards=shards,
            workers=workers,
        )
        for s in owned
    }
    return DataIterator(datasets, _fingerprint(config, shards, workers), _sft_measure)


def _load_tokenizer(path: str | None):
    from data.tokenizer import load_tokenizer

    return load_tokenizer(path)


def _process(index: int | None, count: int | None) -> tuple[int, int]:
    if index is None or count is None:
        import jax

        return jax.process_index(), jax.process_count()
    if not 0 <= index < count:
        raise ValueError(f"process_index {index} is not in [0, {count})")
    return index, count


def opd_prompt_data(
    instructions: Sequence[Instruction],
    *,
    global_batch_size: int,
    max_prompt_len: int,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    enable_thinking: bool = True,
    tokenizer: Any | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    data_shards: int = 0,
) -> DataIterator:
    """Batches of instruction prompts for General OPD, for this JAX process.

    Each batch: `prompt_ids` int32 `[b, max_prompt_len]` (right-padded with the pad token),
    `prompt_lengths` int32 `[b]`, and `index` int32 `[b]` into `instructions` (for ids,
    constraints and references). Prompts longer than `max_prompt_len` are dropped and counted.
    Deterministic in `seed`; split into data shards (0: the default count) and saved or
    restored as for SFT, so the global batch does not depend on the process count.
    """
    if not instructions:
        raise ValueError("opd_prompt_data: no instructions")
    tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(None)
    process_index, process_count = _process(process_index, process_count)
    shards = resolve_shards(data_shards, global_batch_size, process_count)
    prepare_prompt = PreparePrompt(
        tokenizer,
        max_prompt_len=max_prompt_len,
        pad=pad_id(tokenizer),
        enable_thinking=enable_thinking,
    )
    items = grain.MapDataset.source(list(enumerate(instructions)))
    read = grain.ReadOptions(num_threads=1, prefetch_buffer_size=64)
    datasets = {}
    for shard in owned_shards(shards, process_index, process_count):
        ds, barren = shard_of(items, shard, shards, seed=seed, shuffle=shuffle, what="instructions")
        it = ds.repeat(num_epochs).map_with_index(prepare_prompt).to_iter_dataset(read)
        datasets[shard] = RowsIterDataset(it, max_barren=barren).batch(
            global_batch_size // shards, drop_remainder=True
        )
    keys = dict(
        n=len(instructions),
        ids=hashlib.sha256("\n".join(i.id for i in instructions).encode()).hexdigest(),
        batch=global_batch_size,
        max_prompt_len=max_prompt_len,
        seed=seed,
        shuffle=shuffle,
        epochs=num_epochs,
        thinking=enable_thinking,
        shards=shards,
    )
    fingerprint = hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]
    return DataIterator(
        datasets, fingerprint, lambda b: {"prompt_tokens": b["prompt_lengths"].sum()}
    )
