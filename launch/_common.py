"""What every launch script shares: one way to build a model config from a config's `model`
block and a weight source, the weight sources themselves, the tokenizer directory, and the
start-up of a main.

A weight source is `(kind, path)`: "random" (the preset's architecture, tiny models), "hf"
(a local Hugging Face directory) or "orbax" (a `save_params` directory, a training step
directory or a run's `checkpoints/` folder). A checkpoint's own architecture always wins;
the `model` block adds the runtime fields (dtypes, MoE dispatch, attention, remat).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import models
from hat_jax import host_memory, sharding, train
from hat_jax.checkpoint import read_model_config, restore_params
from launch import _logs

KINDS = ("random", "hf", "orbax")
_NOT_RUNTIME = ("preset", "vocab_size")


def define_flags(default_config: str) -> dict[str, Any]:
    """`--config` (an ml_collections config file, locked) and `--run_dir`. Called only when a
    launch module runs as a script: the modules are imported side by side (by the demo, the
    tests), and absl flags are global."""
    from absl import flags
    from ml_collections import config_flags

    return {
        "config": config_flags.DEFINE_config_file("config", default_config, lock_config=True),
        "run_dir": flags.DEFINE_string("run_dir", None, "Overrides config.run_dir."),
    }


def run_main(stage: str, run: Callable, summary: Callable, defined: dict[str, Any]) -> None:
    """The body of every stage's main: quiet library logs, `jax.distributed` when launched as
    several processes, (CPU) freed host memory kept in the process, the run, its summary."""
    import jax

    _logs.quiet()
    sharding.initialize_distributed()
    host_memory.retain_freed_memory()  # CPU: no page faults re-touching each step's buffers
    result = run(defined["config"].value, run_dir=defined["run_dir"].value)
    if jax.process_index() == 0:
        print("\n".join(f"{stage}: {line}" for line in summary(result)))


def runtime_fields(model_block: Any) -> dict[str, Any]:
    """The runtime `QwenConfig` fields of a config's `model` block."""
    return {k: v for k, v in model_block.to_dict().items() if k not in _NOT_RUNTIME}


def check_kind(kind: str, name: str, kinds: tuple[str, ...] = KINDS) -> None:
    if kind not in kinds:
        raise ValueError(f"config.{name}.kind={kind!r}: choose one of {kinds}")


def _exists(path: str) -> bool:
    """The path holds something: a file, or a folder that is not empty (a run's `checkpoints/`
    folder exists, empty, from its start until its first checkpoint is committed)."""
    p = pathlib.Path(path) if path else None
    return p is not None and p.exists() and (not p.is_dir() or any(p.iterdir()))


def model_config(
    model_block: Any, source: tuple[str, str], tokenizer: Any, *, name: str = "init"
) -> models.QwenConfig:
    """The `QwenConfig` of a model: a checkpoint's own architecture, or the block's preset.

    `model_block.vocab_size` applies to a preset only: 0 is the tokenizer's size rounded up to
    a multiple of 128 (even sharding), -1 the preset's own, > 0 that size. A source whose
    checkpoint is not there yet gives the preset too (so configs build before the run that
    writes the checkpoint; `init_source` names the missing path when the stage starts).

    Raises:
      ValueError: the tokenizer has more tokens than the model's vocabulary.
    """
    kind, path = source
    check_kind(kind, name)
    runtime = runtime_fields(model_block)
    if kind == "random" or not _exists(path):
        config = models.QwenConfig.preset(model_block.preset, **runtime)
        size = model_block.vocab_size
        if size == 0:
            size = -(-len(tokenizer) // 128) * 128
        config = config.replace(vocab_size=size) if size > 0 else config
    elif kind == "hf":
        config = models.QwenConfig.from_hf(path, **runtime)
    else:
        saved = read_model_config(path)
        if "model_type" in saved:
            config = models.QwenConfig.from_hf(saved, **runtime)
        else:
            config = models.QwenConfig.from_dict(saved).replace(**runtime)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"config.{name}: the tokenizer has {len(tokenizer)} tokens but the model's "
            f"vocabulary has {config.vocab_size}"
        )
    return config


def require(source: tuple[str, str], name: str) -> str:
    """The source's kind, once its path is known to exist (FileNotFoundError names it)."""
    kind, path = source
    check_kind(kind, name)
    if kind != "random" and not _exists(path):
        raise FileNotFoundError(f"config.{name}.path={path!r} does not exist or is empty "
                                f"({name} kind {kind})")  # fmt: skip
    return kind


def draft_head(
    block,
    num_draft_tokens: int,
    policy: tuple[str, str],
    config: models.QwenConfig,
    *,
    block_name: str,
) -> models.MTPHead | None:
    """The MTP draft head of speculative sampling in a stage (`<block>.num_draft_tokens` > 0):
    `<block>.draft_head` (an Orbax head directory such as an MTP stage's `<run>/head`, or an
    HF checkpoint with `mtp.*` tensors), else the policy's own HF checkpoint's; None when
    `num_draft_tokens` is 0. The head takes the policy's dtypes and is checked against its
    shapes."""
    if not num_draft_tokens:
        return None
    from serve import convert

    path = block.get("draft_head", "")
    if not path and policy[0] == "hf" and convert.has_mtp(policy[1]):
        path = policy[1]
    if not path:
        raise ValueError(
            f"config.{block_name}.num_draft_tokens={num_draft_tokens} needs an MTP draft head: "
            f"set config.{block_name}.draft_head (an MTP stage's <run>/head, or an HF checkpoint "
            "with mtp.* tensors)"
        )
    if not pathlib.Path(path).exists():
        raise FileNotFoundError(f"config.{block_name}.draft_head: {path} does not exist")
    if convert.is_hf_dir(path):
        return convert.load_mtp(path, config=config)
    return convert.restore_mtp(path, config)


def init_source(source: tuple[str, str], config: models.QwenConfig, *, name: str) -> train.Init:
    """`train.RANDOM`, or `abstract params -> params` reading the source into its shards.

    Raises:
      FileNotFoundError: the source's path does not exist.
    """
    kind, path = source
    if require(source, name) == "random":
        return train.RANDOM
    if kind == "orbax":
        return lambda abstract: restore_params(path, target=abstract)[0]
    from flax import nnx

    from serve import convert

    def from_hf(abstract):  # tensor by tensor from the host straight into its shards
        loaded = convert.load_hf(
            path, dtype=config.param_dtype, shardings=sharding.shardings_of(abstract)
        )[1]
        return nnx.state(loaded, nnx.Param)

    return from_hf


def tokenizer_dir(c: Any, *parts: str) -> str | None:
    """`c.data.tokenizer_dir`, else the first of `parts` that is a Hugging Face source,
    else None (the bundled demo tokenizer)."""
    if c.data.get("tokenizer_dir"):
        return c.data.tokenizer_dir
    for part in parts:
        if c[part].kind == "hf" and c[part].path:
            return c[part].path
    return None
