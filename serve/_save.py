"""`Qwen` (and its `MTPHead`) -> an HF directory that transformers and SGLang load; an Orbax
parameter checkpoint -> the same.

The export holds sharded safetensors with `model.safetensors.index.json`, `config.json` and
`generation_config.json` (`serve._hf_files`), the tokenizer files of a given directory
(`serve.digest.TOKENIZER_FILES`) and, written last, the digest manifest `hat_digest.json`
(`serve.digest`: the sha256 of every file, which evaluation, serving and release compare).
Every file goes through `hat_jax.files` (a temporary name beside it, fsync, `os.replace`), so a
crash mid-export never leaves a truncated file under its final name; the index is written after
every shard it lists. The layout defaults to what SGLang serves: Qwen3.5 as the vision-language
wrapper with fused experts (`--language-model-only`), Qwen3-MoE as the text model with
per-expert tensors (the only form SGLang's qwen3_moe loader reads).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx

from hat_jax import files
from hat_jax.checkpoint import read_model_config, restore_params
from hat_jax.metrics import Progress
from models import MTPHead, Qwen, QwenConfig, check_mtp_config
from serve import _hf_files, _hf_map
from serve._hf_read import INDEX_FILE, TEXT_PREFIX, VL_PREFIX
from serve._load import (
    abstract_mtp,
    abstract_qwen,
    config_from_checkpoint,
    dtype_name,
    path_str,
    restore_mtp,
)
from serve.digest import DIGEST_FILE, TOKENIZER_FILES, write_digest


def _host_slice(array: jax.Array, block: int) -> np.ndarray:
    """`array[block]` on the host: a free view for CPU arrays, one slice's transfer otherwise."""
    if all(d.platform == "cpu" for d in array.devices()):
        return np.asarray(array)[block]
    return np.asarray(jax.device_get(array[block]))


def _layer_getter(state: Mapping[str, nnx.Variable], position: int, block: int):
    """Get(sub-path) -> numpy array of one layer, fetched once."""
    cache: dict[str, np.ndarray] = {}

    def get(sub: str) -> np.ndarray:
        if sub not in cache:
            cache[sub] = _host_slice(state[f"blocks/layers/{position}/{sub}"].get_value(), block)
        return cache[sub]

    return get


def _tensor_plan(config: QwenConfig, prefix: str, expert_layout: str) -> list[tuple]:
    """Every HF tensor to write, in file order: (name, shape, layer or None, builder)."""
    items = []
    for name, build in _hf_map.global_to_hf(config, prefix).items():
        items.append((name, _hf_map.global_shapes(config, prefix)[name], None, build))
    for i, kind in enumerate(config.layer_types):
        shapes = _hf_map.hf_layer_shapes(config, kind, expert_layout)
        for suffix, build in _hf_map.hf_from_ours(config, kind, expert_layout).items():
            items.append((f"{prefix}layers.{i}.{suffix}", shapes[suffix], i, build))
    return items


def _mtp_items(mtp: MTPHead, config: QwenConfig, expert_layout: str) -> list[tuple]:
    """The head's `mtp.*` tensors as `_tensor_plan` items (built from the head's own state)."""
    check_mtp_config(config)
    state = {path_str(p): v for p, v in nnx.to_flat_state(nnx.state(mtp, nnx.Param))}
    ours = {k: tuple(v.shape) for k, v in nnx.to_flat_state(nnx.state(abstract_mtp(config)))}
    theirs = {k: tuple(v.get_value().shape) for k, v in state.items()}
    if {path_str(k): s for k, s in ours.items()} != theirs:
        raise ValueError("save_hf: the MTP head's parameters do not match the model config")

    def get(path: str) -> np.ndarray:
        return np.asarray(jax.device_get(state[path].get_value()))

    shapes = _hf_map.mtp_shapes(config, expert_layout)
    return [
        (name, shapes[name], None, lambda _g, build=build: build(get))
        for name, build in _hf_map.mtp_to_hf(config, expert_layout).items()
    ]


def _shards(items: list[tuple], itemsize: int, max_bytes: int) -> list[list[tuple]]:
    shards: list[list[tuple]] = [[]]
    size = 0
    for item in items:
        nbytes = int(np.prod(item[1])) * itemsize
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += nbytes
    return shards


def _shard_tensors(
    shard: list[tuple], config: QwenConfig, state, np_dtype
) -> Iterator[tuple[str, np.ndarray]]:
    period = len(config.block_pattern)
    getter, getter_layer = None, None
    for name, shape, layer, build in shard:
        if layer is None:
            value = build(lambda path: np.asarray(state[path].get_value()))
        else:
            if layer != getter_layer:
                getter = _layer_getter(state, layer % period, layer // period)
                getter_layer = layer
            value = build(getter)
        if tuple(value.shape) != tuple(shape):
            raise AssertionError(f"{name}: built {value.shape}, expected {shape}")
        yield name, np.ascontiguousarray(value.astype(np_dtype))


def _copy_tokenizer(src: pathlib.Path, out: pathlib.Path) -> None:
    copied = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not any(n.startswith("tokenizer") for n in copied):
        raise FileNotFoundError(f"save_hf: {src} holds no tokenizer.json / tokenizer_config.json")
    for name in copied:
        files.copy_file(src / name, out / name)


def save_hf(
    model: Qwen,
    config: QwenConfig,
    out_dir: os.PathLike | str,
    *,
    tokenizer_dir: os.PathLike | str | None = None,
    dtype: Any = "bfloat16",
    layout: str | None = None,
    expert_layout: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
    mtp: MTPHead | None = None,
    overwrite: bool = True,
    progress: bool = True,
) -> pathlib.Path:
    """Writes `model` as an HF directory that transformers and SGLang load.

    Args:
        model, config: the model and its config.
        out_dir: the directory to write (created; old safetensors in it are replaced).
        tokenizer_dir: a directory whose tokenizer files (and chat template) are copied.
        dtype: dtype of the written tensors.
        layout: "vl" (`model.language_model.` prefix, `qwen3_5_moe` config; Qwen3.5 default)
            or "text" (`model.` prefix; the only layout of Qwen3-MoE).
        expert_layout: "fused" (Qwen3.5 default) or "per_expert" (Qwen3-MoE default).
        max_shard_bytes: size bound of each safetensors file.
        extra_tensors: more tensors to write as they are.
        mtp: an MTP draft head for this model: written as the 19 `mtp.*` tensors, its experts
            in `expert_layout` (Qwen3.5 only).
        overwrite: allow an existing non-empty `out_dir`.
        progress: show a progress bar over the tensors written.

    Returns:
        `out_dir` as a path.
    """
    layout = layout or ("vl" if config.is_qwen3_5 else "text")
    expert_layout = expert_layout or ("fused" if config.is_qwen3_5 else "per_expert")
    if expert_layout not in ("fused", "per_expert"):
        raise ValueError(f"save_hf: expert_layout={expert_layout!r} must be fused or per_expert")
    dtype_str = dtype_name(dtype)
    base = pathlib.Path(tokenizer_dir) / _hf_files.GENERATION_CONFIG_FILE if tokenizer_dir else None
    json_files = _hf_files.json_files(
        config, layout=layout, dtype=dtype_str,
        base_generation=json.loads(base.read_text()) if base and base.is_file() else None,
    )  # fmt: skip
    out = pathlib.Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"save_hf: {out} is not empty (pass overwrite=True)")
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.safetensors")) + [out / INDEX_FILE, out / DIGEST_FILE]:
        old.unlink(missing_ok=True)

    np_dtype = np.dtype(jnp.dtype(dtype_str))
    prefix = VL_PREFIX if layout == "vl" else TEXT_PREFIX
    state = {path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    items = _tensor_plan(config, prefix, expert_layout)
    if mtp is not None:
        items.extend(_mtp_items(mtp, config, expert_layout))
    planned = {item[0] for item in items}
    clash = sorted(planned & set(extra_tensors or {}))
    if clash:
        raise ValueError(f"save_hf: extra_tensors repeat tensors already written: {clash[:10]}")
    for name, value in (extra_tensors or {}).items():
        items.append((name, tuple(value.shape), None, lambda _g, v=value: np.asarray(v)))
    shards = _shards(items, np_dtype.itemsize, max_shard_bytes)
    weight_map, total, written = {}, 0, 0
    bar = Progress(len(items), desc="export", unit="tensor", enabled=progress)
    for number, shard in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = dict(_shard_tensors(shard, config, state, np_dtype))
        with files.atomic_path(out / file) as tmp:
            safetensors.numpy.save_file(tensors, str(tmp), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
        total += sum(t.nbytes for t in tensors.values())
        written += len(shard)
        bar.update(written)
    bar.close()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files.write_json(out / INDEX_FILE, index)
    for name, obj in json_files.items():
        files.write_json(out / name, obj)
    if tokenizer_dir is not None:
        _copy_tokenizer(pathlib.Path(tokenizer_dir), out)
    write_digest(out)  # last: a crash before it leaves no manifest, never a stale one
    return out


def to_hf(
    checkpoint: os.PathLike | str,
    out_dir: os.PathLike | str,
    *,
    mtp: os.PathLike | str | None = None,
    **save: Any,
) -> pathlib.Path:
    """An Orbax parameter checkpoint (a `save_params` directory, a training step directory or a
    run's `checkpoints/`) as an HF directory; `mtp`: a head checkpoint to export with it.
    `save`: `save_hf`'s keyword arguments (tokenizer_dir, dtype, layout, expert_layout)."""
    config = config_from_checkpoint(read_model_config(checkpoint))
    graphdef, abstract_state = nnx.split(abstract_qwen(config))
    state, _ = restore_params(checkpoint, target=abstract_state)
    head = restore_mtp(mtp, config) if mtp else None
    return save_hf(nnx.merge(graphdef, state), config, out_dir, mtp=head, **save)
