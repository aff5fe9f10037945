"""HF safetensors <-> hat-jax `Qwen` conversion, and the `python -m serve.convert` CLI.

    load_hf(hf_dir, *, dtype) -> (config, model)
    load_mtp(hf_dir, *, config=None, dtype=None) -> MTPHead     (the `mtp.*` draft head)
    has_mtp(hf_dir) -> bool
    save_hf(model, config, out_dir, *, tokenizer_dir=None, dtype="bfloat16", layout=None,
            expert_layout=None, mtp=None)
    restore_mtp(directory, config) -> MTPHead                    (an Orbax head checkpoint)

Loading reads the (optionally sharded, indexed) safetensors lazily, one parameter at a time:
each stacked parameter is assembled on the host from its HF tensors and handed to JAX before
the next is read, so the host holds at most one stacked parameter beyond the model itself.
It accepts the text-only (`model.`) and vision-language (`model.language_model.`) prefixes
and fused (`mlp.experts.gate_up_proj`) or per-expert expert tensors, and reports missing,
unexpected and mis-shaped tensors by name before reading any data. `model.visual.*` (vision
tower) is skipped.

The MTP (NextN) draft head of Qwen3.5 is not part of `Qwen`: `load_hf` leaves the `mtp.*`
tensors alone (logging that they are there) and `load_mtp` reads them into an `MTPHead`, the
19 tensors of REFERENCE.md (`mtp.fc.weight [H, 2H]`, `mtp.pre_fc_norm_embedding.weight`,
`mtp.pre_fc_norm_hidden.weight`, `mtp.norm.weight` and one full-attention MoE decoder layer
`mtp.layers.0.*`, fused or per-expert experts; the names are the same in the text-only and
the vision-language layout). Grafting a base checkpoint's head onto a trained policy is
`load_mtp(base_dir, config=policy_config)`: the tensors are checked against the policy's
shapes and every missing, unexpected or mis-shaped one is named. `save_hf(..., mtp=head)`
writes the head in the export's expert layout; transformers ignores `mtp.*` when loading.

Saving writes `config.json` explicitly (every field SGLang reads), sharded safetensors with
`model.safetensors.index.json`, and the tokenizer files of `tokenizer_dir`. Every file goes
through a temporary name and `os.replace`. The layout defaults to what SGLang serves:
Qwen3.5 as the vision-language wrapper with fused experts (`--language-model-only`),
Qwen3-MoE as the text model with per-expert tensors (the only form SGLang's qwen3_moe
loader reads).

CLI:
    python -m serve.convert from-hf --hf_dir A --out B [--dtype float32] [--no_mtp]
    python -m serve.convert to-hf --checkpoint B --out C [--dtype bfloat16]
        [--layout vl|text] [--expert_layout fused|per_expert] [--tokenizer_dir T]
        [--mtp HEAD | --no_mtp]
    python -m serve.convert graft --checkpoint B (--hf_dir BASE | --random) [--out HEAD]

On the Orbax side the head lives beside the parameters: `from-hf` writes it as a second
`save_params` directory `B/mtp/` (same `model_config.json`); `to-hf` exports `--mtp HEAD` (a
head checkpoint: `save_params` directory, or a step of the MTP adaptation stage), else
`B/mtp/` when present. `graft` attaches a base checkpoint's head (or a random one, only when
asked with `--random`) to a policy checkpoint as `B/mtp/`, shapes checked against the policy.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
import safetensors.numpy
from flax import nnx
from safetensors import safe_open

from models import MTPHead, Qwen, QwenConfig, check_mtp_config
from serve import _hf_map

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
MTP_DIR = "mtp"  # the head's save_params directory beside an Orbax parameter checkpoint
_TEXT_PREFIX = "model."
_VL_PREFIX = "model.language_model."
_SKIPPED_PREFIXES = ("model.visual.", "visual.")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


class HFCheckpointError(ValueError):
    """An HF directory that does not match the model its config describes."""


class _Tensors:
    """Lazy, name-addressed access to the safetensors files of an HF directory."""

    def __init__(self, hf_dir: pathlib.Path):
        self.dir = hf_dir
        index = hf_dir / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(hf_dir.glob("*.safetensors"))
            if not files:
                raise HFCheckpointError(f"{hf_dir}: no *.safetensors files and no {INDEX_FILE}")
            weight_map = {}
            for file in files:
                with safe_open(file, "np") as f:
                    weight_map.update(dict.fromkeys(f.keys(), file.name))
        self.weight_map: dict[str, str] = weight_map
        self._handles: dict[str, Any] = {}

    def _handle(self, name: str):
        file = self.weight_map[name]
        if file not in self._handles:
            path = self.dir / file
            if not path.is_file():
                raise HFCheckpointError(f"{path} (listed in {INDEX_FILE} for {name}) is missing")
            self._handles[file] = safe_open(path, "np")
        return self._handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        return self._handle(name).get_tensor(name)


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def _layer_plan(config: QwenConfig, tensors: _Tensors, prefix: str) -> list[tuple[str, str]]:
    """(kind, expert format) of every HF layer, the format detected from the names present."""
    plan = []
    for i, kind in enumerate(config.layer_types):
        fused = f"{prefix}layers.{i}.mlp.experts.gate_up_proj" in tensors.weight_map
        per_expert = f"{prefix}layers.{i}.mlp.experts.0.gate_proj.weight" in tensors.weight_map
        plan.append((kind, "per_expert" if per_expert and not fused else "fused"))
    return plan


def _expected(config: QwenConfig, prefix: str, plan) -> dict[str, tuple[int, ...]]:
    expected = dict(_hf_map.global_shapes(config, prefix))
    for i, (kind, experts) in enumerate(plan):
        for suffix, shape in _hf_map.hf_layer_shapes(config, kind, experts).items():
            expected[f"{prefix}layers.{i}.{suffix}"] = shape
    return expected


def _problems(
    tensors: _Tensors, expected: Mapping[str, tuple[int, ...]], present: set[str]
) -> list[str]:
    """Missing, unexpected (of `present`) and mis-shaped tensors, each kind on one line."""
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    shapes = [
        f"{n}: file {tensors.shape(n)} vs expected {s}"
        for n, s in expected.items()
        if n in present and tensors.shape(n) != s
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing: {', '.join(missing[:40])}")
    if extra:
        problems.append(f"{len(extra)} unexpected: {', '.join(extra[:40])}")
    if shapes:
        problems.append(f"{len(shapes)} mis-shaped: {'; '.join(shapes[:40])}")
    return problems


def _check_names(tensors: _Tensors, expected: Mapping[str, tuple[int, ...]]) -> None:
    """Raises `HFCheckpointError` naming missing, unexpected and mis-shaped tensors."""
    present = set(tensors.weight_map)
    mtp = sorted(n for n in present if n.startswith(_hf_map.MTP_PREFIX))
    skipped = sorted(n for n in present if n.startswith(_SKIPPED_PREFIXES))
    ignored = set(mtp) | set(skipped) | {n for n in present if n.endswith("rotary_emb.inv_freq")}
    problems = _problems(tensors, expected, present - ignored)
    if problems:
        raise HFCheckpointError(f"{tensors.dir} does not match its config: " + " | ".join(problems))
    if mtp:
        log.info("%s: %d mtp.* tensors (the MTP draft head) left for load_mtp", tensors.dir,
                 len(mtp))  # fmt: skip
    if skipped:
        log.info("%s: %d vision-tower tensors skipped (language model only)", tensors.dir,
                 len(skipped))  # fmt: skip


def _path_str(path: tuple) -> str:
    return "/".join(str(p) for p in path)


def _assemble(config: QwenConfig, path: str, shape, np_dtype, tensors, prefix, plan) -> np.ndarray:
    """Our parameter `path` (stacked if a block parameter) built from the HF tensors."""
    if not path.startswith("blocks/layers/"):
        build = _hf_map.global_from_hf(config, prefix)[path]
        return np.asarray(build(tensors.read), np_dtype)
    _, _, position, sub = path.split("/", 3)
    position = int(position)
    period = len(config.block_pattern)
    out = np.empty(shape, np_dtype)
    for block in range(config.num_blocks):
        layer = block * period + position
        kind, experts = plan[layer]
        build = _hf_map.ours_from_hf(config, kind, experts)[sub]
        layer_prefix = f"{prefix}layers.{layer}."
        out[block] = build(lambda suffix, p=layer_prefix: tensors.read(p + suffix))
    return out


def abstract_model(config: QwenConfig) -> nnx.Module:
    """The model's structure with `jax.ShapeDtypeStruct` leaves: nothing allocated."""
    return nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0)))


def load_hf(
    hf_dir: os.PathLike | str,
    *,
    dtype: Any = "float32",
    compute_dtype: Any = None,
    shardings: Any = None,
    **runtime: Any,
) -> tuple[QwenConfig, Qwen]:
    """Loads an HF Qwen3.5-MoE / Qwen3-MoE directory into a `Qwen`.

    Args:
        hf_dir: directory with `config.json` and safetensors (sharded with an index or not).
        dtype: parameter dtype (the config's `param_dtype`).
        compute_dtype: the config's `dtype` (defaults to `dtype`).
        shardings: where to place each parameter: a state of `jax.sharding.Sharding`s with the
            structure of the model's parameter state (e.g. `hat_jax.sharding.state_shardings`
            of `abstract_model(config)`); each parameter goes straight to its shards.
        **runtime: other runtime fields of `QwenConfig` (moe_dispatch, remat, ...).

    Returns:
        (config, model).

    Raises:
        HFCheckpointError: tensors missing, unexpected or mis-shaped (all named).
    """
    hf_dir = pathlib.Path(hf_dir)
    param_dtype = _dtype_name(dtype)
    config = QwenConfig.from_hf(
        hf_dir,
        param_dtype=param_dtype,
        dtype=_dtype_name(compute_dtype or dtype),
        **runtime,
    )
    tensors = _Tensors(hf_dir)
    vl = any(n.startswith(_VL_PREFIX) for n in tensors.weight_map)
    prefix = _VL_PREFIX if vl else _TEXT_PREFIX
    plan = _layer_plan(config, tensors, prefix)
    _check_names(tensors, _expected(config, prefix, plan))

    def build(name, shape, np_dtype):
        return _assemble(config, name, shape, np_dtype, tensors, prefix, plan)

    return config, _fill(abstract_model(config), build, param_dtype, shardings, "load_hf")


def _fill(abstract: nnx.Module, build, param_dtype: str, shardings, caller: str) -> nnx.Module:
    """`abstract` with every parameter built on the host (one at a time) and placed."""
    graphdef, state = nnx.split(abstract)
    placement = {}
    if shardings is not None:
        placement = {_path_str(p): _leaf(v) for p, v in nnx.to_flat_state(shardings)}
    np_dtype = np.dtype(jnp.dtype(param_dtype))
    for path, var in nnx.to_flat_state(state):
        name = _path_str(path)
        value = np.asarray(build(name, var.shape, np_dtype), np_dtype)
        if tuple(value.shape) != tuple(var.shape):
            raise AssertionError(f"{caller}: built {name} {value.shape}, expected {var.shape}")
        if shardings is not None:
            if name not in placement:
                raise ValueError(f"{caller}: shardings has no entry for parameter {name}")
            array = jax.device_put(value, placement[name])
        else:
            array = jnp.asarray(value)
        del value
        var.set_value(array)
    return nnx.merge(graphdef, state)


# -- the MTP draft head ------------------------------------------------------------------------


def has_mtp(hf_dir: os.PathLike | str) -> bool:
    """Whether an HF directory holds `mtp.*` tensors (an MTP draft head)."""
    names = _Tensors(pathlib.Path(hf_dir)).weight_map
    return any(n.startswith(_hf_map.MTP_PREFIX) for n in names)


def abstract_mtp(config: QwenConfig) -> MTPHead:
    """The draft head's structure with `jax.ShapeDtypeStruct` leaves: nothing allocated."""
    return nnx.eval_shape(lambda: MTPHead(config, rngs=nnx.Rngs(0)))


def _check_mtp_names(tensors: _Tensors, config: QwenConfig) -> str:
    """The head's expert layout; raises `HFCheckpointError` naming every bad `mtp.*` tensor."""
    present = {n for n in tensors.weight_map if n.startswith(_hf_map.MTP_PREFIX)}
    if not present:
        raise HFCheckpointError(
            f"{tensors.dir} holds no mtp.* tensors (no MTP draft head): graft one from a base "
            "checkpoint that has it, or start the head from random initialisation"
        )
    per_expert = f"{_hf_map.MTP_LAYER}mlp.experts.0.gate_proj.weight" in present
    fused = f"{_hf_map.MTP_LAYER}mlp.experts.gate_up_proj" in present
    experts = "per_expert" if per_expert and not fused else "fused"
    expected = _hf_map.mtp_shapes(config, experts)
    problems = _problems(tensors, expected, present)
    if problems:
        raise HFCheckpointError(
            f"{tensors.dir}: the MTP head does not match the model config "
            f"(hidden {config.hidden_size}, {config.num_experts} experts): " + " | ".join(problems)
        )
    return experts


def load_mtp(
    hf_dir: os.PathLike | str,
    *,
    config: QwenConfig | None = None,
    dtype: Any = None,
    compute_dtype: Any = None,
    shardings: Any = None,
    **runtime: Any,
) -> MTPHead:
    """Loads the MTP draft head (the 19 `mtp.*` tensors) of an HF Qwen3.5-MoE directory.

    Grafting: pass the `config` of the (trained) policy the head is to serve; the tensors
    are then checked against that policy's shapes, so a head from a base checkpoint of
    another size is refused with every offending tensor named.

    Args:
        hf_dir: an HF directory (text-only or vision-language layout, fused or per-expert
            expert tensors, sharded with an index or not).
        config: the policy's config (default: the directory's own `config.json`).
        dtype: parameter dtype (default: `config.param_dtype`, float32 from the directory).
        compute_dtype: the config's `dtype` (default: `dtype`, or the given config's).
        shardings: a state of `jax.sharding.Sharding`s with the head's structure (e.g.
            `hat_jax.sharding.state_shardings` of `abstract_mtp(config)`).
        **runtime: other runtime fields of `QwenConfig`.

    Raises:
        HFCheckpointError: no `mtp.*` tensors, or missing / unexpected / mis-shaped ones.
        ValueError: the config's family has no MTP head.
    """
    hf_dir = pathlib.Path(hf_dir)
    if config is None:
        param_dtype = _dtype_name(dtype or "float32")
        config = QwenConfig.from_hf(
            hf_dir, param_dtype=param_dtype, dtype=_dtype_name(compute_dtype or param_dtype)
        )
    else:
        param_dtype = _dtype_name(dtype or config.param_dtype)
        config = config.replace(
            param_dtype=param_dtype, dtype=_dtype_name(compute_dtype or dtype or config.dtype)
        )
    config = config.replace(**runtime) if runtime else config
    try:
        check_mtp_config(config)
    except ValueError as err:
        raise HFCheckpointError(f"{hf_dir}: {err}") from err
    tensors = _Tensors(hf_dir)
    builders = _hf_map.mtp_from_hf(config, _check_mtp_names(tensors, config))

    def build(name, shape, np_dtype):
        return builders[name](tensors.read)

    return _fill(abstract_mtp(config), build, param_dtype, shardings, "load_mtp")


def restore_mtp(directory: os.PathLike | str, config: QwenConfig, *, target: Any = None) -> MTPHead:
    """Restores an `MTPHead` from an Orbax checkpoint of the head.

    Args:
        directory: a `save_params` directory of the head (e.g. `<checkpoint>/mtp`, or the
            adaptation stage's `<run>/head`), or a step directory of the adaptation stage
            (whose `params` item is `{"head": ...}`).
        config: the policy's config (the head has the same).
        target: the head's abstract parameter state with shardings (default: host-local).
    """
    from hat_jax.checkpoint import CheckpointMismatchError, restore_params

    check_mtp_config(config)
    graphdef, abstract = nnx.split(abstract_mtp(config))
    target = abstract if target is None else target
    try:
        state, _ = restore_params(directory, target=target)
    except CheckpointMismatchError as err:
        try:
            nested, _ = restore_params(directory, target={"head": nnx.to_pure_dict(target)})
        except CheckpointMismatchError:
            raise err from None
        state = jax.tree.map(lambda x: x, target)
        nnx.replace_by_pure_dict(state, nested["head"])
    return nnx.merge(graphdef, state)


def _leaf(value: Any) -> Any:
    return value.get_value() if isinstance(value, nnx.Variable) else value


def read_hf_tensors(hf_dir: os.PathLike | str, prefix: str) -> dict[str, np.ndarray]:
    """Every tensor of an HF directory whose name starts with `prefix` (e.g. "mtp.")."""
    tensors = _Tensors(pathlib.Path(hf_dir))
    return {n: tensors.read(n) for n in sorted(tensors.weight_map) if n.startswith(prefix)}


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


def _write_json(path: pathlib.Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


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
) -> pathlib.Path:
    """Writes `model` as an HF directory that transformers and SGLang load.

    Args:
        model, config: the model and its config.
        out_dir: the directory to write (created; old safetensors in it are replaced).
        tokenizer_dir: a directory whose tokenizer files (and generation config) are copied.
        dtype: dtype of the written tensors.
        layout: "vl" (`model.language_model.` prefix, `qwen3_5_moe` config; Qwen3.5 default)
            or "text" (`model.` prefix; the only layout of Qwen3-MoE).
        expert_layout: "fused" (Qwen3.5 default) or "per_expert" (Qwen3-MoE default).
        max_shard_bytes: size bound of each safetensors file.
        extra_tensors: more tensors to write as they are.
        mtp: an MTP draft head for this model: written as the 19 `mtp.*` tensors, its experts
            in `expert_layout` (Qwen3.5 only).
        overwrite: allow an existing non-empty `out_dir`.

    Returns:
        `out_dir` as a path.
    """
    layout = layout or ("vl" if config.is_qwen3_5 else "text")
    expert_layout = expert_layout or ("fused" if config.is_qwen3_5 else "per_expert")
    if expert_layout not in ("fused", "per_expert"):
        raise ValueError(f"save_hf: expert_layout={expert_layout!r} must be fused or per_expert")
    hf_config = config.to_hf_dict(layout=layout)
    out = pathlib.Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"save_hf: {out} is not empty (pass overwrite=True)")
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.safetensors")) + [out / INDEX_FILE]:
        old.unlink(missing_ok=True)

    dtype_name = _dtype_name(dtype)
    np_dtype = np.dtype(jnp.dtype(dtype_name))
    prefix = _VL_PREFIX if layout == "vl" else _TEXT_PREFIX
    state = {_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
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
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = dict(_shard_tensors(shard, config, state, np_dtype))
        tmp = out / f".{file}.tmp-{os.getpid()}"
        safetensors.numpy.save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, out / file)
        weight_map.update(dict.fromkeys(tensors, file))
        total += sum(t.nbytes for t in tensors.values())
    _write_json(out / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    hf_config["dtype"] = dtype_name
    if layout == "vl":
        hf_config["text_config"]["dtype"] = dtype_name
    _write_json(out / "config.json", hf_config)
    if tokenizer_dir is not None:
        _copy_tokenizer(pathlib.Path(tokenizer_dir), out)
    return out


def _mtp_items(mtp: MTPHead, config: QwenConfig, expert_layout: str) -> list[tuple]:
    """The head's `mtp.*` tensors as `_tensor_plan` items (built from the head's own state)."""
    check_mtp_config(config)
    state = {_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(mtp, nnx.Param))}
    ours = {k: tuple(v.shape) for k, v in nnx.to_flat_state(nnx.state(abstract_mtp(config)))}
    theirs = {k: tuple(v.get_value().shape) for k, v in state.items()}
    if {_path_str(k): s for k, s in ours.items()} != theirs:
        raise ValueError("save_hf: the MTP head's parameters do not match the model config")

    def get(path: str) -> np.ndarray:
        return np.asarray(jax.device_get(state[path].get_value()))

    shapes = _hf_map.mtp_shapes(config, expert_layout)
    return [
        (name, shapes[name], None, lambda _g, build=build: build(get))
        for name, build in _hf_map.mtp_to_hf(config, expert_layout).items()
    ]


def _copy_tokenizer(src: pathlib.Path, out: pathlib.Path) -> None:
    copied = [n for n in _TOKENIZER_FILES if (src / n).is_file()]
    if not any(n.startswith("tokenizer") for n in copied):
        raise FileNotFoundError(f"save_hf: {src} holds no tokenizer.json / tokenizer_config.json")
    for name in copied:
        tmp = out / f".{name}.tmp-{os.getpid()}"
        shutil.copyfile(src / name, tmp)
        os.replace(tmp, out / name)


def _config_from_checkpoint(model_config: Mapping[str, Any], **runtime) -> QwenConfig:
    if "model_type" in model_config:  # an HF config dict
        return QwenConfig.from_hf(dict(model_config), **runtime)
    return QwenConfig.from_dict(dict(model_config)).replace(**runtime)


def _from_hf(args: argparse.Namespace) -> None:
    from hat_jax.checkpoint import save_params

    config, model = load_hf(args.hf_dir, dtype=args.dtype)
    save_params(args.out, nnx.state(model, nnx.Param), model_config=config.to_dict(),
                overwrite=args.overwrite)  # fmt: skip
    head = ""
    if not args.no_mtp and config.is_qwen3_5 and has_mtp(args.hf_dir):
        mtp = load_mtp(args.hf_dir, config=config)
        save_params(pathlib.Path(args.out) / MTP_DIR, nnx.state(mtp, nnx.Param),
                    model_config=config.to_dict(), overwrite=True)  # fmt: skip
        head = f", MTP head in {pathlib.Path(args.out) / MTP_DIR}"
    print(f"wrote {args.out} ({config.family}, {config.num_layers} layers{head})")


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
    from hat_jax.checkpoint import read_model_config, restore_params

    config = _config_from_checkpoint(read_model_config(checkpoint))
    graphdef, abstract_state = nnx.split(abstract_model(config))
    state, _ = restore_params(checkpoint, target=abstract_state)
    head = restore_mtp(mtp, config) if mtp else None
    return save_hf(nnx.merge(graphdef, state), config, out_dir, mtp=head, **save)


def _to_hf(args: argparse.Namespace) -> None:
    mtp_dir = args.mtp
    beside = pathlib.Path(args.checkpoint) / MTP_DIR
    if mtp_dir is None and beside.is_dir() and not args.no_mtp:
        mtp_dir = str(beside)
    if mtp_dir and args.no_mtp:
        raise SystemExit("to-hf: --mtp and --no_mtp exclude each other")
    to_hf(args.checkpoint, args.out, mtp=mtp_dir, tokenizer_dir=args.tokenizer_dir,
          dtype=args.dtype, layout=args.layout, expert_layout=args.expert_layout)  # fmt: skip
    print(f"wrote {args.out}" + (f" (MTP head from {mtp_dir})" if mtp_dir else ""))


def _graft(args: argparse.Namespace) -> None:
    """Attaches a draft head to a policy checkpoint: a base checkpoint's `mtp.*` tensors
    (checked against the policy's shapes) or, when asked, a random initialisation."""
    from hat_jax.checkpoint import read_model_config, save_params

    config = _config_from_checkpoint(read_model_config(args.checkpoint))
    config = config.replace(param_dtype=args.dtype, dtype=args.dtype)
    if bool(args.hf_dir) == args.random:
        raise SystemExit("graft: give exactly one of --hf_dir BASE and --random")
    if args.random:
        head = MTPHead(config, rngs=nnx.Rngs(args.seed))
    else:
        head = load_mtp(args.hf_dir, config=config)
    out = pathlib.Path(args.out) if args.out else pathlib.Path(args.checkpoint) / MTP_DIR
    save_params(out, nnx.state(head, nnx.Param), model_config=config.to_dict(),
                overwrite=args.overwrite)  # fmt: skip
    source = "random initialisation" if args.random else args.hf_dir
    print(f"wrote {out} (MTP head from {source} for {args.checkpoint})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m serve.convert", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("from-hf", help="HF directory -> Orbax parameter checkpoint")
    a.add_argument("--hf_dir", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--dtype", default="float32", help="parameter dtype (default float32)")
    a.add_argument("--overwrite", action="store_true")
    a.add_argument("--no_mtp", action="store_true", help="do not carry the mtp.* draft head")
    a.set_defaults(run=_from_hf)
    b = sub.add_parser("to-hf", help="Orbax parameter checkpoint -> HF directory")
    b.add_argument("--checkpoint", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--dtype", default="bfloat16")
    b.add_argument("--layout", choices=("vl", "text"), default=None)
    b.add_argument("--expert_layout", choices=("fused", "per_expert"), default=None)
    b.add_argument("--tokenizer_dir", default=None)
    b.add_argument(
        "--mtp",
        default=None,
        help="MTP head checkpoint to export (default: <checkpoint>/mtp if present)",
    )
    b.add_argument("--no_mtp", action="store_true", help="export without the draft head")
    b.set_defaults(run=_to_hf)
    g = sub.add_parser("graft", help="MTP head of a base HF checkpoint -> beside a policy")
    g.add_argument("--checkpoint", required=True, help="the policy's Orbax checkpoint")
    g.add_argument("--hf_dir", default=None, help="base HF checkpoint with mtp.* tensors")
    g.add_argument("--random", action="store_true", help="a randomly initialised head instead")
    g.add_argument("--seed", type=int, default=0, help="seed of --random")
    g.add_argument("--out", default=None, help="head directory (default <checkpoint>/mtp)")
    g.add_argument("--dtype", default="float32", help="parameter dtype (default float32)")
    g.add_argument("--overwrite", action="store_true")
    g.set_defaults(run=_graft)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
