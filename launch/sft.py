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
import pathlib

from absl import app
from flax import nnx

import data
import models
from data.tokenizer import load_tokenizer
from hat_jax import hsa, sharding, train
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
    online = data.OnlineHSAConfig(probability=c.data.online_hsa_probability, dims=dims)
    pipeline = dict(sources=(c.data.corpus or "<unset>",), seq_len=t.seq_len, seed=t.seed,
                    global_batch_size=t.batch_size, truncation=c.data.truncation,
                    tokenizer_dir=tokenizer_dir, worker_count=c.data.worker_count,
                    data_shards=c.data.data_shards)  # fmt: skip
    evaluation = None
    if c.data.eval_split:
        evaluation = data.PipelineConfig(split=c.data.eval_split, shuffle=False, **pipeline)
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
        data=data.PipelineConfig(split=c.data.split, online_hsa=online, **pipeline),
        eval_data=evaluation,
        init=init,
        run_dir=pathlib.Path(run_dir or c.run_dir),
    )


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
        f"checkpoint: {result.checkpoint_dir}",
        f"metrics: {result.metrics_path}; plots: {result.plots_dir}",
    ]


def main(argv):
    del argv
    _common.run_main("sft", run, summary, _FLAGS)


if __name__ == "__main__":
    _FLAGS.update(_common.define_flags("configs/sft_demo.py"))
    app.run(main)
