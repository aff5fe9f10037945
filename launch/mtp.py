"""MTP draft-head adaptation of a trained policy, then an HF export with the `mtp.*` tensors.

  python -m launch.mtp --config=configs/mtp_demo.py            # the demo's SFT policy
  python -m launch.mtp --config=configs/mtp_demo.py:random     # a fresh random tiny policy
  python -m launch.mtp --config=configs/mtp_qwen3_6_35b_a3b.py \
      --config.policy.path=/ckpt/rl/checkpoints --config.head.path=/ckpt/Qwen3.6-35B-A3B

The policy (`config.policy`: "orbax" checkpoint, "hf" directory, or "random") is frozen; the
draft head (`config.head`: grafted from a base HF checkpoint's `mtp.*` tensors ("hf"), a head
checkpoint ("orbax"), or "random") is trained on the policy's own rollouts of the instruction
prompts (`rl.run_mtp`). Writes `<run>/head`, `<run>/mtp_summary.{json,md}` and, with
`config.export.hf_dir`, the policy + head as an HF directory for SGLang.
"""

import dataclasses
import logging
import pathlib

import jax
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

import data
import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import host_memory, sharding, train
from hat_jax.checkpoint import read_model_config, restore_params
from hat_jax.sharding import shardings_of

_FLAGS = {}


def _define_flags() -> None:
    """The command-line flags, defined only when run as a script: other code (the demo, the
    config tests) imports this module beside `launch.sft`, whose flags have the same names."""
    _FLAGS["config"] = config_flags.DEFINE_config_file(
        "config", "configs/mtp_demo.py", lock_config=True
    )
    _FLAGS["run_dir"] = flags.DEFINE_string("run_dir", None, "Overrides config.run_dir.")


_KINDS = {"policy": ("orbax", "hf", "random"), "head": ("hf", "orbax", "random")}


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's dataclasses."""

    mtp: rl.MTPConfig
    model: models.QwenConfig
    policy: tuple[str, str]
    head: tuple[str, str]
    run_dir: pathlib.Path


def _model_config(c, tokenizer) -> models.QwenConfig:
    runtime = {k: c.model[k] for k in ("dtype", "param_dtype", "moe_dispatch", "remat")}
    kind, path = c.policy.kind, c.policy.path
    if kind == "random" or not path or not pathlib.Path(path).exists():
        # A random policy, or a checkpoint not there yet (`run` then says so): the preset.
        config = models.QwenConfig.preset(c.model.preset, **runtime)
        size = c.model.vocab_size or -(-len(tokenizer) // 128) * 128
        return config.replace(vocab_size=size) if size > 0 else config
    if kind == "hf":
        return models.QwenConfig.from_hf(path, **runtime)
    saved = read_model_config(path)
    if "model_type" in saved:
        return models.QwenConfig.from_hf(saved, **runtime)
    return models.QwenConfig.from_dict(saved).replace(**runtime)


def _tokenizer_dir(c) -> str | None:
    """`data.tokenizer_dir`, else a base HF checkpoint's (head or policy), else the demo's."""
    if c.data.tokenizer_dir:
        return c.data.tokenizer_dir
    for part in ("head", "policy"):
        if c[part].kind == "hf" and c[part].path:
            return c[part].path
    return None


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` and converts it into dataclasses (reads the tokenizer and policy config)."""
    for part, kinds in _KINDS.items():
        if c[part].kind not in kinds:
            raise ValueError(f"config.{part}.kind={c[part].kind!r}: choose one of {kinds}")
    model = _model_config(c, load_tokenizer(_tokenizer_dir(c)))
    models.check_mtp_config(model)
    coef = c.aux_loss_coef if c.aux_loss_coef >= 0 else model.router_aux_loss_coef
    rollout = {k: v for k, v in c.rollout.to_dict().items() if k != "batch_size"}
    return Built(
        mtp=rl.MTPConfig(
            trainer=train.TrainerConfig.from_dict(c.trainer.to_dict()),
            optimizer=train.OptimizerConfig.from_dict(c.optimizer.to_dict()),
            mesh=sharding.MeshConfig.from_dict(c.mesh.to_dict()),
            rollout=rl.RolloutConfig(**rollout),
            num_draft_tokens=c.num_draft_tokens,
            aux_loss_coef=coef,
            measure_speculative=c.measure_speculative,
        ),
        model=model,
        policy=(c.policy.kind, c.policy.path),
        head=(c.head.kind, c.head.path),
        run_dir=pathlib.Path(run_dir or c.run_dir),
    )


def _init(part: str, kind: str, path: str, model: models.QwenConfig):
    if kind == "random":
        return rl.MTP_RANDOM
    if not path or not pathlib.Path(path).exists():
        raise FileNotFoundError(f"config.{part}.path={path!r} does not exist ({part} kind {kind})")
    from serve import convert

    if part == "policy" and kind == "orbax":
        return lambda abstract: restore_params(path, target=abstract)[0]
    if part == "policy":
        return lambda abstract: nnx.state(
            convert.load_hf(path, dtype=model.param_dtype, shardings=shardings_of(abstract))[1],
            nnx.Param,
        )
    if kind == "hf":  # graft the base checkpoint's head, checked against the policy's shapes
        return lambda abstract: nnx.state(
            convert.load_mtp(path, config=model, shardings=shardings_of(abstract)), nnx.Param
        )
    return lambda abstract: nnx.state(convert.restore_mtp(path, model, target=abstract), nnx.Param)


def _prompts(c, tokenizer):
    """Training and held-out prompt iterators: disjoint instructions (`data.source =
    "instructions"`), or the agent prompts of a corpus's train and eval splits ("corpus")."""
    if c.data.source == "corpus":
        if not c.data.corpus:
            raise ValueError("config.data.corpus is required with data.source='corpus'")
        pipeline = dict(sources=(c.data.corpus,), seq_len=c.data.corpus_seq_len,
                        global_batch_size=c.rollout.batch_size, seed=c.trainer.seed,
                        tokenizer_dir=_tokenizer_dir(c), worker_count=0)  # fmt: skip
        cut = dict(batch_size=c.rollout.batch_size, max_prompt_len=c.data.max_prompt_len,
                   pad_id=data.pad_id(tokenizer))  # fmt: skip
        return tuple(
            rl.prompts_from_rows(data.sft_data(data.PipelineConfig(split=split, **pipeline)), **cut)
            for split in (c.data.split, c.data.eval_split)
        )
    if c.data.source != "instructions":
        raise ValueError(f"config.data.source={c.data.source!r}: 'instructions' or 'corpus'")
    instructions = data.load_instructions(c.data.instructions or None)
    held = c.data.heldout_instructions
    if not 0 < held < len(instructions):
        raise ValueError(f"data.heldout_instructions={held} of {len(instructions)} instructions")
    common = dict(global_batch_size=c.rollout.batch_size, max_prompt_len=c.data.max_prompt_len,
                  enable_thinking=c.data.enable_thinking, tokenizer=tokenizer)  # fmt: skip
    return (
        data.opd_prompt_data(instructions[:-held], seed=c.trainer.seed, **common),
        data.opd_prompt_data(instructions[-held:], shuffle=False, **common),
    )


def run(c, *, run_dir: str | None = None, mesh=None) -> rl.MTPResult:
    """Runs (or resumes) the MTP stage of config `c`, then the HF export it asks for."""
    built = build(c, run_dir=run_dir)
    tokenizer = load_tokenizer(_tokenizer_dir(c))
    prompts, heldout = _prompts(c, tokenizer)
    result = rl.run_mtp(
        built.mtp,
        model_config=built.model,
        run_dir=built.run_dir,
        prompts=prompts,
        eval_prompts=heldout,
        init_policy=_init("policy", *built.policy, built.model),
        init_head=_init("head", *built.head, built.model),
        stop_tokens=(tokenizer.eos_token_id,),
        pad_id=data.pad_id(tokenizer),
        run_config=c.to_dict(),
        mesh=mesh,
    )
    if c.export.hf_dir:
        export(c, built, result)
    return result


def export(c, built: Built, result: rl.MTPResult) -> pathlib.Path:
    """The frozen policy with the adapted head as an HF directory (`mtp.*` included)."""
    from serve import convert

    kind, path = built.policy
    source = str(result.run_dir / "policy") if kind == "random" else path
    if kind == "hf":
        _, policy = convert.load_hf(source, dtype=built.model.param_dtype)
    else:
        graphdef, abstract = nnx.split(convert.abstract_model(built.model))
        policy = nnx.merge(graphdef, restore_params(source, target=abstract)[0])
    head = convert.restore_mtp(result.head_dir, built.model)
    tokenizer_dir = _tokenizer_dir(c) or str(pathlib.Path(data.__file__).parent / "tokenizer")
    return convert.save_hf(policy, built.model, c.export.hf_dir, tokenizer_dir=tokenizer_dir,
                           dtype=c.export.dtype, mtp=head)  # fmt: skip


def summary(result: rl.MTPResult) -> list[str]:
    """Report lines for a finished run (e.g. for `launch.demo`)."""
    b, a = result.before, result.after
    line = (f"acceptance length (simulated, k drafts) {b['acceptance_length']:.3f} -> "
            f"{a['acceptance_length']:.3f}; per-token acceptance {b['acceptance']:.3f} -> "
            f"{a['acceptance']:.3f}")  # fmt: skip
    if "speculative_acceptance_length" in a:
        line += (f"; measured speculative {b['speculative_acceptance_length']:.3f} -> "
                 f"{a['speculative_acceptance_length']:.3f}")  # fmt: skip
    return [f"{result.step} steps in {result.seconds:.0f} s: {line}",
            f"head: {result.head_dir}; summary: {result.summary_path}"]  # fmt: skip


def main(argv):
    del argv
    logging.getLogger("absl").setLevel(logging.WARNING)
    sharding.initialize_distributed()
    host_memory.retain_freed_memory()  # CPU: no page faults re-touching each step's buffers
    result = run(_FLAGS["config"].value, run_dir=_FLAGS["run_dir"].value)
    if jax.process_index() == 0:
        print("\n".join(f"mtp: {line}" for line in summary(result)))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
