"""HF safetensors <-> hat-jax `Qwen` conversion: the public API and its command line.

    load_hf(hf_dir, *, dtype) -> (config, model)
    load_checkpoint(path, *, dtype) -> (config, model)          (an HF directory or Orbax)
    load_mtp(hf_dir, *, config=None, dtype=None) -> MTPHead     (the `mtp.*` draft head)
    has_mtp(hf_dir) -> bool
    save_hf(model, config, out_dir, *, tokenizer_dir=None, dtype="bfloat16", layout=None,
            expert_layout=None, mtp=None)
    to_hf(checkpoint, out_dir, *, mtp=None, **save_hf_kwargs)    (an Orbax checkpoint)
    restore_mtp(directory, config) -> MTPHead                    (an Orbax head checkpoint)
    compare_with_transformers(hf_dir) -> float   (max |logits diff| vs transformers, fp32)

The work is in private modules: `_hf_map` (the explicit tensor name map), `_hf_read` (reading
an HF directory by tensor name; missing, unexpected and mis-shaped tensors are named before any
data is read), `_load` (building the model one parameter at a time), `_hf_files`
(`config.json`, `generation_config.json`) and `_save` (the export, every file written
atomically).

The MTP (NextN) draft head of Qwen3.5 is not part of `Qwen`: `load_hf` leaves the `mtp.*`
tensors alone (logging that they are there) and `load_mtp` reads them into an `MTPHead`, the
19 tensors of REFERENCE.md. Grafting a base checkpoint's head onto a trained policy is
`load_mtp(base_dir, config=policy_config)`: the tensors are checked against the policy's
shapes. `save_hf(..., mtp=head)` writes the head in the export's expert layout; transformers
ignores `mtp.*` when loading.

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
import logging
import pathlib
import sys

from flax import nnx

from hat_jax.checkpoint import read_model_config, save_params
from models import MTPHead
from serve._hf_read import INDEX_FILE, HFCheckpointError, has_mtp, read_hf_tensors
from serve._load import (
    abstract_mtp,
    abstract_qwen,
    config_from_checkpoint,
    is_hf_dir,
    load_checkpoint,
    load_hf,
    load_mtp,
    restore_mtp,
)
from serve._save import save_hf, to_hf
from serve._verify import compare_with_transformers

__all__ = [
    "INDEX_FILE",
    "MTP_DIR",
    "HFCheckpointError",
    "abstract_mtp",
    "abstract_qwen",
    "compare_with_transformers",
    "has_mtp",
    "is_hf_dir",
    "load_checkpoint",
    "load_hf",
    "load_mtp",
    "main",
    "read_hf_tensors",
    "restore_mtp",
    "save_hf",
    "to_hf",
]

MTP_DIR = "mtp"  # the head's save_params directory beside an Orbax parameter checkpoint


def _from_hf(args: argparse.Namespace) -> None:
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
    config = config_from_checkpoint(read_model_config(args.checkpoint))
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
