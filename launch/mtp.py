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
import pathlib

import jax
from absl import app
from flax import nnx

import data
import models
import rl
from data.tokenizer import load_tokenizer
from hat_jax import sharding, train
from hat_jax.sharding import shardings_of
from launch import _common

_FLAGS: dict = {}


_KINDS = {"policy": ("orbax", "hf", "random"), "head": ("hf", "orbax", "random")}


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's dataclasses."""

    mtp: rl.MTPConfig
    model: models.QwenConfig
    policy: tuple[str, str]
    head: tuple[str, str]
    run_dir: pathlib.Path


def _tokenizer_dir(c) -> str | None:
    """`data.tokenizer_dir`, else a base HF checkpoint's (head or policy), else the demo's."""
    return _common.tokenizer_dir(c, "head", "policy")


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` and converts it into dataclasses (reads the tokenizer and policy config)."""
    for part, kinds in _KINDS.items():
        _common.check_kind(c[part].kind, part, kinds)
    model = _common.model_config(
        c.model, (c.policy.kind, c.policy.path), load_tokenizer(_tokenizer_dir(c)), name="policy"
    )
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


def _head_init(kind: str, path: str, model: models.QwenConfig):
    """The head's source: random, grafted from a base HF checkpoint, or a head checkpoint."""
    if _common.require((kind, path), "head") == "random":
        return train.RANDOM
    from serve import convert

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
        if c.rollout.batch_size % jax.process_count():
            raise ValueError(
                f"rollout.batch_size={c.rollout.batch_size} does not split over "
                f"{jax.process_count()} processes"
            )
        # this process's prompts of each batch: the rollouts gather every process's
        cut = dict(batch_size=c.rollout.batch_size // jax.process_count(),
                   max_prompt_len=c.data.max_prompt_len,
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
        init_policy=_common.init_source(built.policy, built.model, name="policy"),
        init_head=_head_init(*built.head, built.model),
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
    tokenizer_dir = _tokenizer_dir(c) or str(pathlib.Path(data.__file__).parent / "tokenizer")
    save = dict(tokenizer_dir=tokenizer_dir, dtype=c.export.dtype)
    if kind != "hf":  # an Orbax checkpoint, or the random policy the stage saved
        source = str(result.run_dir / "policy") if kind == "random" else path
        return convert.to_hf(source, c.export.hf_dir, mtp=result.head_dir, **save)
    _, policy = convert.load_hf(path, dtype=built.model.param_dtype)
    head = convert.restore_mtp(result.head_dir, built.model)
    return convert.save_hf(policy, built.model, c.export.hf_dir, mtp=head, **save)


def summary(result: rl.MTPResult) -> list[str]:
    """Report lines for a finished run (e.g. for the pipeline report)."""
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
    _common.run_main("mtp", run, summary, _FLAGS)


if __name__ == "__main__":
    _FLAGS.update(_common.define_flags("configs/mtp_demo.py"))
    app.run(main)
