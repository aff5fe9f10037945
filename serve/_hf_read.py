"""Reading an HF directory: its safetensors by tensor name, and the name and shape checks run
before any data is read.

Accepts the text-only (`model.`) and vision-language (`model.language_model.`) prefixes, fused
(`mlp.experts.gate_up_proj`) or per-expert expert tensors, and sharded files with an index or
plain `*.safetensors`. `model.visual.*` (vision tower) is skipped; `mtp.*` (the MTP draft head)
is left to its own check. Building parameters from the tensors is `serve._load`'s.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from safetensors import safe_open

from hat_jax.checkpoint import describe_mismatch
from models import QwenConfig
from serve import _hf_map

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
TEXT_PREFIX = "model."
VL_PREFIX = "model.language_model."
_SKIPPED_PREFIXES = ("model.visual.", "visual.")


class HFCheckpointError(ValueError):
    """An HF directory that does not match the model its config describes."""


class Tensors:
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

    @property
    def prefix(self) -> str:
        """The language model's name prefix: vision-language wrapper or text-only model."""
        return VL_PREFIX if any(n.startswith(VL_PREFIX) for n in self.weight_map) else TEXT_PREFIX


def layer_plan(config: QwenConfig, tensors: Tensors, prefix: str) -> list[tuple[str, str]]:
    """(kind, expert format) of every HF layer, the format detected from the names present."""
    plan = []
    for i, kind in enumerate(config.layer_types):
        fused = f"{prefix}layers.{i}.mlp.experts.gate_up_proj" in tensors.weight_map
        per_expert = f"{prefix}layers.{i}.mlp.experts.0.gate_proj.weight" in tensors.weight_map
        plan.append((kind, "per_expert" if per_expert and not fused else "fused"))
    return plan


def expected_shapes(config: QwenConfig, prefix: str, plan) -> dict[str, tuple[int, ...]]:
    """Every language-model tensor the directory should hold: name -> shape."""
    expected = dict(_hf_map.global_shapes(config, prefix))
    for i, (kind, experts) in enumerate(plan):
        for suffix, shape in _hf_map.hf_layer_shapes(config, kind, experts).items():
            expected[f"{prefix}layers.{i}.{suffix}"] = shape
    return expected


def _problems(
    tensors: Tensors, expected: Mapping[str, tuple[int, ...]], present: set[str]
) -> list[str]:
    found = {n: tensors.shape(n) for n in present}
    return describe_mismatch(expected, found, found_as="file")


def check_names(tensors: Tensors, expected: Mapping[str, tuple[int, ...]]) -> None:
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


def check_mtp_names(tensors: Tensors, config: QwenConfig) -> str:
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
    problems = _problems(tensors, _hf_map.mtp_shapes(config, experts), present)
    if problems:
        raise HFCheckpointError(
            f"{tensors.dir}: the MTP head does not match the model config "
            f"(hidden {config.hidden_size}, {config.num_experts} experts): " + " | ".join(problems)
        )
    return experts


def has_mtp(hf_dir: os.PathLike | str) -> bool:
    """Whether an HF directory holds `mtp.*` tensors (an MTP draft head)."""
    names = Tensors(pathlib.Path(hf_dir)).weight_map
    return any(n.startswith(_hf_map.MTP_PREFIX) for n in names)


def read_hf_tensors(hf_dir: os.PathLike | str, prefix: str) -> dict[str, np.ndarray]:
    """Every tensor of an HF directory whose name starts with `prefix` (e.g. "mtp.")."""
    tensors = Tensors(pathlib.Path(hf_dir))
    return {n: tensors.read(n) for n in sorted(tensors.weight_map) if n.startswith(prefix)}
