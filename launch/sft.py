"""HSA-SFT (or the Fixed-Harness SFT ablation) of a Qwen MoE policy on a teacher corpus.

  python -m launch.sft --config=configs/sft_demo.py            # tiny model, demo corpus
  python -m launch.sft --config=configs/sft_demo.py:fixed      # Fixed-Harness ablation
  python -m launch.sft --config=configs/base_demo.py           # the base: general instructions
  python -m launch.sft --config=configs/sft_qwen3_6_35b_a3b.py \
      --config.init.path=/ckpt/Qwen3.6-35B-A3B --config.data.corpus=/data/corpus

The same command runs on every host of a cluster (SLURM, or a JobSet setting
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID). A run directory that already
holds checkpoints is resumed. Starts from `config.init`: "random" (tiny models), "hf" (a local
Hugging Face checkpoint) or "orbax" (a `save_params` / training checkpoint directory).
"""

import dataclasses
import json
import math
import pathlib

from absl import app
from flax import nnx

import data
import models
from data.tokenizer import load_tokenizer
from hat_jax import eval as hev
from hat_jax import files, hsa, sharding, train
from launch import _common

_FLAGS: dict = {}
# harness_mode -> the corpus states it trains on ("general": the base stage's instructions)
_MODES = {
    "hsa": ("original+augmented", "augmented"),
    "fixed": ("original",),
    "general": (data.GENERAL_STATES,),
}


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's dataclasses."""

    sft: train.SFTConfig
    model: models.QwenConfig
    data: data.PipelineConfig
    eval_data: data.PipelineConfig | None
    init: tuple[str, str]
    run_dir: pathlib.Path
    tool_choice_records: int = 0
    copy_probe_samples: int = 0
    lookup_eval_records: int = 0


def _required(value: str, name: str) -> str:
    if not value:
        raise ValueError(f"config.{name} is required for this config")
    return value


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` and converts it into dataclasses (loads only the tokenizer)."""
    _common.check_kind(c.init.kind, "init")
    if c.data.harness_mode not in _MODES:
        raise ValueError(f"config.data.harness_mode={c.data.harness_mode!r}: one of {list(_MODES)}")
    tokenizer_dir = _common.tokenizer_dir(c, "init")
    init = (c.init.kind, c.init.path)
    model = _common.model_config(c.model, init, load_tokenizer(tokenizer_dir))
    t = c.trainer
    dims = hsa.parse_dims(c.data.online_hsa_dims)
    dims = None if dims == hsa.ALL else tuple(sorted(str(d) for d in dims))
    online = data.OnlineHSAConfig(
        probability=c.data.online_hsa_probability,
        dims=dims,
        opaque_names=c.data.get("online_hsa_opaque_names"),
    )
    pipeline = dict(sources=(c.data.corpus or "<unset>",), seq_len=t.seq_len, seed=t.seed,
                    global_batch_size=t.batch_size, truncation=c.data.truncation,
                    tokenizer_dir=tokenizer_dir, worker_count=c.data.worker_count,
                    data_shards=c.data.data_shards)  # fmt: skip
    evaluation = None
    if c.data.eval_split:
        evaluation = data.PipelineConfig(split=c.data.eval_split, shuffle=False, **pipeline)
    choice = c.data.get("tool_choice_records", 0)
    if choice < 0:
        raise ValueError(f"config.data.tool_choice_records={choice}: must be >= 0")
    if choice and c.data.harness_mode == "general":
        raise ValueError(
            "config.data.tool_choice_records > 0 scores tool calls, which general instructions "
            "do not make: set it to 0 for harness_mode='general'"
        )
    copy_samples = c.data.get("copy_probe_samples", 0)
    if copy_samples < 0:
        raise ValueError(f"config.data.copy_probe_samples={copy_samples}: must be >= 0")
    lookup = c.data.get("lookup_eval_records", 0)
    if lookup < 0:
        raise ValueError(f"config.data.lookup_eval_records={lookup}: must be >= 0")
    if lookup and c.data.harness_mode != "general":
        raise ValueError(
            "config.data.lookup_eval_records > 0 scores the base corpus's lookup items: set it "
            "to 0 unless harness_mode='general'"
        )
    coef = c.aux_loss_coef if c.aux_loss_coef >= 0 else model.router_aux_loss_coef
    return Built(
        sft=train.SFTConfig(
            trainer=train.TrainerConfig.from_dict(c.trainer.to_dict()),
            optimizer=train.OptimizerConfig.from_dict(c.optimizer.to_dict()),
            mesh=sharding.MeshConfig.from_dict(c.mesh.to_dict()),
            aux_loss_coef=coef,
            logits_chunk=c.logits_chunk,
        ),
        model=model,
        data=data.PipelineConfig(
            split=c.data.split,
            online_hsa=online,
            bare_probability=c.data.get("bare_probability", 0.0),
            **pipeline,
        ),  # fmt: skip
        eval_data=evaluation,
        init=init,
        run_dir=pathlib.Path(run_dir or c.run_dir),
        tool_choice_records=choice if c.data.eval_split else 0,  # runs with the eval loss
        copy_probe_samples=copy_samples if c.data.eval_split else 0,
        lookup_eval_records=lookup if c.data.eval_split else 0,
    )


def _evaluations(c, built: Built) -> list:
    """The model evaluations run with the eval loss: the teacher-forced tool choice on the
    first eval records (`hat_jax.eval.tool_choice`, logged as `eval/tool_choice*`), the
    in-context copying probe (`hat_jax.eval.copy_score`, `eval/copy`) and the teacher-forced
    answers of the eval split's lookup items (`hat_jax.eval.answer_score`, `eval/lookup*`).
    Under several processes every process builds the same ones (the same records, the same
    seeded rows) and runs their forward passes together (`hat_jax.eval.model_greedy_fn`)."""
    evaluations = []
    if not (built.tool_choice_records or built.copy_probe_samples or built.lookup_eval_records):
        return evaluations
    tokenizer = load_tokenizer(built.data.tokenizer_dir)
    if built.tool_choice_records:
        conversations = data.read_conversations(
            [c.data.corpus], c.data.eval_split, limit=built.tool_choice_records
        )
        if not conversations:
            raise ValueError(f"{c.data.corpus}: no {c.data.eval_split} records for tool choice")
        evaluations.append(hev.tool_choice_evaluation(conversations, tokenizer))
    if built.copy_probe_samples:
        evaluations.append(hev.copy_evaluation(tokenizer, samples=built.copy_probe_samples))
    if built.lookup_eval_records:
        path = pathlib.Path(c.data.corpus) / f"{c.data.eval_split}.jsonl"
        items = [r for r in files.read_jsonl(path, what="general corpus record")
                 if r.get("source") == data.LOOKUP_SCHEMA][: built.lookup_eval_records]  # fmt: skip
        if not items:
            raise ValueError(f"config.data.lookup_eval_records > 0 but {path} holds no lookup "
                             "items (write the corpus with general.lookup_share > 0)")  # fmt: skip
        evaluations.append(hev.answer_evaluation(items, tokenizer))
    return evaluations


def _check_corpus(c, built: Built) -> None:
    """The corpus must exist and have been generated for the configured harness mode."""
    manifest = (
        pathlib.Path(_required(c.data.corpus, "data.corpus")) / f"{c.data.split}.manifest.json"
    )
    if not manifest.is_file():
        maker = "launch.make_general" if c.data.harness_mode == "general" else "launch.make_corpus"
        raise FileNotFoundError(f"{manifest} not found: build the corpus with {maker}")
    states = json.loads(manifest.read_text())["config"]["states"]
    if states not in _MODES[c.data.harness_mode]:
        raise ValueError(
            f"data.harness_mode={c.data.harness_mode!r} but {manifest} was generated with "
            f"states={states!r}; use a corpus made for this mode"
        )
    if c.data.harness_mode == "fixed" and built.data.online_hsa.probability > 0:
        raise ValueError("the Fixed-Harness ablation needs data.online_hsa_probability=0")
    if c.data.harness_mode == "general" and built.data.online_hsa.probability > 0:
        raise ValueError("general instructions carry no Harness: data.online_hsa_probability=0")


def run(c, *, run_dir: str | None = None, mesh=None) -> train.SFTResult:
    """Runs (or resumes) the SFT stage described by config `c` (`mesh` overrides its mesh)."""
    built = build(c, run_dir=run_dir)
    _check_corpus(c, built)
    seed = built.sft.trainer.seed
    return train.run_sft(
        built.sft,
        model_fn=lambda: models.Qwen(built.model, rngs=nnx.Rngs(seed)),
        data=data.sft_data(built.data),
        run_dir=built.run_dir,
        init_params=_common.init_source(built.init, built.model, name="init"),
        eval_data=(lambda: data.sft_data(built.eval_data)) if built.eval_data else None,
        model_evaluations=_evaluations(c, built),
        run_config=c.to_dict(),
        model_config=built.model.to_dict(),
        mesh=mesh,
    )


def summary(result: train.SFTResult) -> list[str]:
    """Report lines for a finished run (used by the pipeline report)."""
    m = result.final_metrics
    resumed = f", resumed from step {result.resumed_from}" if result.resumed_from else ""
    return [
        f"step {result.step}{resumed}: loss {m.get('loss', float('nan')):.4f}, "
        f"accuracy {m.get('accuracy', float('nan')):.3f}, "
        f"{m.get('tokens_per_second', 0):.0f} tokens/s",
        *_eval_lines(result.metrics_path),
        f"checkpoint: {result.checkpoint_dir}",
        f"metrics: {result.metrics_path}; plots: {result.plots_dir}",
    ]


def _eval_lines(path) -> list[str]:
    """Each evaluation's eval loss, teacher-forced tool choice, copying and lookup answers (the
    learning curve)."""
    from hat_jax.metrics import read_metrics

    lines = []
    for r in read_metrics(path):
        if not any(k in r for k in ("eval/loss", "eval/tool_choice", "eval/copy", "eval/lookup")):
            continue
        line = f"eval at step {r['step']}:"
        if r.get("eval/loss") is not None:
            line += f" dev loss {r['eval/loss']:.4f}"
        if r.get("eval/tool_choice") is not None:
            parts = [f"{100 * r['eval/tool_choice']:.1f}% of calls"]
            for key, label in (("first_turn", "first turn"), ("later_turns", "later turns")):
                if r.get(f"eval/tool_choice_{key}") is not None:
                    parts.append(f"{label} {100 * r[f'eval/tool_choice_{key}']:.1f}%")
            decision = r.get("eval/tool_decision")
            if decision is not None and not math.isnan(decision):  # NaN: no tool named
                parts.append(f"named first in the reasoning {100 * decision:.1f}%")
            skill = r.get("eval/skill_decision")
            if skill is not None and not math.isnan(skill):  # NaN: no Skill loaded
                parts.append(f"Skill named {100 * skill:.1f}%")
            line += "; tool choice (teacher-forced) " + ", ".join(parts)
        if r.get("eval/copy") is not None:
            line += f"; in-context copying {100 * r['eval/copy']:.1f}%"
        if r.get("eval/lookup") is not None:
            line += (f"; lookup answers (teacher-forced) {100 * r['eval/lookup']:.1f}% exact, "
                     f"{100 * r.get('eval/lookup_tokens', float('nan')):.1f}% of tokens")  # fmt: skip
        lines.append(line)
    return lines


def main(argv):
    del argv
    _common.run_main("sft", run, summary, _FLAGS)


if __name__ == "__main__":
    _FLAGS.update(_common.define_flags("configs/sft_demo.py"))
    app.run(main)
