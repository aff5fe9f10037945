"""A local JAX policy from a trained checkpoint: `rl.JaxPolicy` over an Orbax or HF directory.

Used by the local server (`serve.server`) and the launch scripts that run policies
(`launch.agent`, `launch.simulate`, `launch.eval` with `--policy jax --checkpoint PATH`). The
checkpoint is an Orbax checkpoint (a run's `checkpoints/`, a step, or a `save_params`
directory) or an HF directory (e.g. an export of `serve.convert to-hf`). The tokenizer is the
HF directory's own, else `tokenizer_dir`, else the bundled demo tokenizer; a vocabulary that
does not fit the model is an error that names both sizes. The description a policy comes with
records `checkpoint_digest` (`serve.digest`: the weights, config and, for an HF directory, its
tokenizer files) and `tokenizer_digest` (the tokenizer files actually loaded), which evaluation
runs and the server report and the release gates compare.
"""

from __future__ import annotations

import pathlib
from typing import Any


def tokenizer_source(checkpoint: str, tokenizer_dir: str | None = None) -> pathlib.Path:
    """The directory a checkpoint's tokenizer is loaded from (see the module docstring)."""
    from data.tokenizer import DEFAULT_DIR
    from serve import convert

    if tokenizer_dir:
        return pathlib.Path(tokenizer_dir)
    path = pathlib.Path(checkpoint)
    if convert.is_hf_dir(path) and (path / "tokenizer_config.json").is_file():
        return path
    return DEFAULT_DIR


def tokenizer_for(checkpoint: str, tokenizer_dir: str | None = None):
    """The tokenizer of a checkpoint (see the module docstring)."""
    from data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_source(checkpoint, tokenizer_dir))


def load_jax_policy(
    checkpoint: str,
    *,
    tokenizer_dir: str | None = None,
    dtype: str = "float32",
    top_k: int = 0,
    max_length: int = 0,
    num_draft_tokens: int = 0,
    mtp_dir: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """`(rl.JaxPolicy, description)` for a checkpoint.

    Args:
      checkpoint: Orbax or HF directory.
      tokenizer_dir: a tokenizer to use instead of the checkpoint's (or the demo one).
      dtype: parameter and compute dtype.
      top_k: the policy's top-k filter (0: none).
      max_length: the sampler's cap on prompt + generated tokens (0: the model's maximum).
      num_draft_tokens: > 0 decodes self-speculatively with the MTP draft head, verifying
        this many drafts per step (the same samples as plain decoding, fewer steps).
      mtp_dir: the head for `num_draft_tokens` (an Orbax head directory, e.g. the MTP stage's
        `<run>/head`); default: the `mtp.*` tensors of an HF checkpoint.

    Raises:
      FileNotFoundError: the checkpoint does not exist.
      ValueError: the tokenizer does not match the model's vocabulary, or speculative
        decoding was asked for without a head.
    """
    import models
    import rl
    from serve import convert, digest

    # Block-wise attention: several 4-8K-token agent prompts prefilled together stay in O(T)
    # memory (dense scores of 16 such rows need ~17 GB), and it is faster on CPU too.
    config, model = convert.load_checkpoint(checkpoint, dtype=dtype, attention_impl="flash")
    tokenizer = tokenizer_for(checkpoint, tokenizer_dir)
    vocab, size = config.vocab_size, len(tokenizer)
    # Checkpoints pad their vocabulary (to a multiple of 128 here, more for released models),
    # but never by more than the tokenizer itself: then the tokenizer is not the model's.
    if size > vocab or vocab > 2 * size + 1024:
        raise ValueError(
            f"the tokenizer ({size} tokens, {tokenizer.name_or_path or 'demo'}) does not match "
            f"the checkpoint {checkpoint} (vocabulary of {vocab}); pass its tokenizer_dir"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    head = _draft_head(checkpoint, config, dtype, mtp_dir) if num_draft_tokens else None
    sampler = models.Sampler(
        model, mtp=head, num_draft_tokens=num_draft_tokens, pad_id=pad,
        max_length=max_length or None,
    )  # fmt: skip
    policy = rl.JaxPolicy(model, tokenizer, top_k=top_k, sampler=sampler)
    return policy, {
        "kind": "jax",
        "checkpoint": str(checkpoint),
        "format": "hf" if convert.is_hf_dir(checkpoint) else "orbax",
        "dtype": dtype,
        "vocab_size": vocab,
        "tokenizer": str(tokenizer.name_or_path or "demo"),
        "layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "num_draft_tokens": num_draft_tokens,
        "checkpoint_digest": digest.checkpoint_digest(checkpoint),
        "tokenizer_digest": digest.tokenizer_digest(tokenizer_source(checkpoint, tokenizer_dir)),
    }


def _draft_head(checkpoint: str, config: Any, dtype: str, mtp_dir: str | None):
    """The MTP head of `mtp_dir`, else of an HF checkpoint's `mtp.*` tensors."""
    from serve import convert

    if mtp_dir:
        return convert.restore_mtp(mtp_dir, config)
    if convert.is_hf_dir(checkpoint) and convert.has_mtp(checkpoint):
        return convert.load_mtp(checkpoint, config=config, dtype=dtype)
    raise ValueError(
        f"speculative decoding needs an MTP draft head: {checkpoint} has no mtp.* tensors "
        "(export with `serve.convert to-hf --mtp HEAD`, or pass mtp_dir)"
    )
