"""HSA-SFT (or the Fixed-Harness SFT ablation) of a Qwen MoE policy on a teacher corpus.

  python -m launch.sft --config=configs/sft_demo.py            # tiny model, demo corpus
  python -m launch.sft --config=configs/sft_demo.py:fixed      # Fixed-Harness ablation
  python -m launch.sft --config=configs/sft_qwen3_6_35b_a3b.py \
      --config.init.path=/ckpt/Qwen3.6-35B-A3B --config.data.corpus=/data/corpus

The same command runs on every host of a cluster (SLURM, or a JobSet setting
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID). A run directory that already
holds checkpoints is resumed. Starts from `config.init`: "random" (tiny models), "hf" (a local
Hugging Face checkpoint) or "orbax" (a `save_params` / training checkpoint directory).
"""

import dataclasses
import json
import logging
import pathlib

import jax
import numpy as np
from absl import app, flags
from flax import nnx
from ml_collections import config_flags

import data
import models
from data.tokenizer import load_tokenizer
from hat_jax import host_memory, sharding, train
from hat_jax.checkpoint import restore_params

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sft_demo.py", lock_config=True)
_RUN_DIR = flags.DEFINE_string("run_dir", None, "Overrides config.run_dir.")
_MODES = {"hsa": ("original+augmented", "augmented"), "fixed": ("original",)}


@dataclasses.dataclass(frozen=True)
class Built:
    """A config converted once into the library's dataclasses."""

    sft: train.SFTConfig
    model: models.QwenConfig
    data: data.PipelineConfig
    eval_data: data.PipelineConfig | None
    init: tuple[str, str]
    run_dir: pathlib.Path


def _model_config(c, tokenizer):
    runtime = {k: v for k, v in c.model.to_dict().items() if k not in ("preset", "vocab_size")}
    if c.init.kind == "hf":
        config = models.QwenConfig.from_hf(_required(c.init.path, "init.path"), **runtime)
    else:
        config = models.QwenConfig.preset(c.model.preset, **runtime)
    if c.model.vocab_size == 0:  # the tokenizer's size, rounded up for even sharding
        return config.replace(vocab_size=-(-len(tokenizer) // 128) * 128)
    return config.replace(vocab_size=c.model.vocab_size) if c.model.vocab_size > 0 else config


def _required(value: str, name: str) -> str:
    if not value:
        raise ValueError(f"config.{name} is required for this config")
    return value


def build(c, *, run_dir: str | None = None) -> Built:
    """Validates `c` and converts it into dataclasses (loads only the tokenizer)."""
    if c.init.kind not in ("random", "hf", "orbax") or c.data.harness_mode not in _MODES:
        raise ValueError(
            f"config: init.kind={c.init.kind!r}, data.harness_mode={c.data.harness_mode!r}"
        )
    tokenizer_dir = c.data.tokenizer_dir or (c.init.path if c.init.kind == "hf" else None)
    model = _model_config(c, load_tokenizer(tokenizer_dir))
    t = c.trainer
    hsa = data.OnlineHSAConfig(probability=c.data.online_hsa_probability)
    pipeline = dict(sources=(c.data.corpus or "<unset>",), seq_len=t.seq_len, seed=t.seed,
                    global_batch_size=t.batch_size, truncation=c.data.truncation,
                    tokenizer_dir=tokenizer_dir, worker_count=c.data.worker_count)  # fmt: skip
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
        data=data.PipelineConfig(split=c.data.split, online_hsa=hsa, **pipeline),
        eval_data=evaluation,
        init=(c.init.kind, c.init.path),
        run_dir=pathlib.Path(run_dir or c.run_dir),
    )


def _check_corpus(c, built: Built) -> None:
    """The corpus must exist and have been generated for the configured harness mode."""
    manifest = (
        pathlib.Path(_required(c.data.corpus, "data.corpus")) / f"{c.data.split}.manifest.json"
    )
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest} not found: build the corpus with launch.make_corpus")
    states = json.loads(manifest.read_text())["config"]["states"]
    if states not in _MODES[c.data.harness_mode]:
        raise ValueError(
            f"data.harness_mode={c.data.harness_mode!r} but {manifest} was generated with "
            f"states={states!r}; use a corpus made for this mode"
        )
    if c.data.harness_mode == "fixed" and built.data.online_hsa.probability > 0:
        raise ValueError("the Fixed-Harness ablation needs data.online_hsa_probability=0")


def _to_shards(host, abstract):
    """One host array placed into `abstract`'s sharding; each device copies only its shard."""
    host = np.asarray(host)
    return jax.make_array_from_callback(abstract.shape, abstract.sharding, lambda i: host[i])


def _init_params(kind: str, path: str, model: models.QwenConfig):
    """`abstract params -> params` for the configured start, or None for random init."""
    if kind == "orbax":
        return lambda abstract: restore_params(path, target=abstract)[0]
    if kind != "hf":
        return None
    from serve.convert import load_hf

    def from_hf(abstract):  # read tensor by tensor on the host, then straight into shards
        with jax.default_device(jax.devices("cpu")[0]):
            _, loaded = load_hf(path, dtype=model.param_dtype, compute_dtype=model.dtype,
                                moe_dispatch=model.moe_dispatch, remat=model.remat)  # fmt: skip
        return jax.tree.map(_to_shards, nnx.state(loaded, nnx.Param), abstract)

    return from_hf


def run(c, *, run_dir: str | None = None, mesh=None) -> train.SFTResult:
    """Runs (or resumes) the SFT stage described by config `c` (`mesh` overrides its mesh)."""
    from flax import nnx

    import data
    import models

    built = build(c, run_dir=run_dir)
    _check_corpus(c, built)
    seed = built.sft.trainer.seed
    return train.run_sft(
        built.sft,
        model_fn=lambda: models.Qwen(built.model, rngs=nnx.Rngs(seed)),
        data=data.sft_data(built.data),
        run_dir=built.run_dir,
        init_params=_init_params(*built.init, built.model),
        eval_data=(lambda: data.sft_data(built.eval_data)) if built.eval_data else None,
        run_config=c.to_dict(),
        model_config=built.model.to_dict(),
        mesh=mesh,
    )


def summary(result: train.SFTResult) -> list[str]:
    """Report lines for a finished run (used by `launch.demo`)."""
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
    logging.getLogger("absl").setLevel(logging.WARNING)
    sharding.initialize_distributed()
    host_memory.retain_freed_memory()  # CPU: no page faults re-touching each step's buffers
    result = run(_CONFIG.value, run_dir=_RUN_DIR.value)
    if jax.process_index() == 0:
        print("\n".join(f"sft: {line}" for line in summary(result)))


if __name__ == "__main__":
    app.run(main)
