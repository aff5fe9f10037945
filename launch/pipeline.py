"""The HAT pipeline as one resumable run with a manifest: base -> corpus -> HSA-SFT -> General
OPD -> HSA-RL -> MTP adaptation -> HF export -> evaluation.

  python -m launch.pipeline --config=configs/pipeline_demo.py [--workdir runs/demo]   # make demo
  python -m launch.pipeline --config=configs/ablations.py:fixed_sft_opd    # an ablation arm
  python -m launch.pipeline --config=configs/pipeline_demo.py --stages=sft,opd   # a subset

Each stage writes under `<workdir>/<stage>` and, when it has finished, `COMPLETE.json`; a rerun
skips complete stages and resumes an interrupted one from its checkpoints. `--fresh` deletes
the workdir first. `<workdir>/manifest.json` records every stage's status, inputs, outputs,
config, timings and versions (corpus manifests, evaluation sets, the Harness, the git commit).
A failed stage is named on stderr and in the manifest, and the exit status is 1. On a cluster,
run the stages one by one (`python -m launch.<stage>` on every host, production configs).
"""

import importlib
import pathlib
import sys

from absl import app, flags

from launch import _logs, _pipeline

_FLAGS: dict = {}


def build(c, *, run_dir: str | None = None) -> dict:
    """Wires the stages under the workdir and builds each stage's config with its own launch
    module (checks every field; loads tokenizers only). Returns the wired blocks."""
    wired = _pipeline.wire(c, pathlib.Path(run_dir or c.workdir))
    for name in _pipeline.parse_stages(c.stages):
        if name in ("sft", "opd", "rl", "mtp", "eval"):
            importlib.import_module(f"launch.{name}").build(wired[name])
        if name == "base":  # `launch.sft` in "general" mode, then its evaluation
            base = wired["base"]
            if base.general.train < 1 or base.general.dev < 0:
                raise ValueError(f"config.base.general: train >= 1 and dev >= 0 records, got "
                                 f"train={base.general.train}, dev={base.general.dev}")  # fmt: skip
            share = base.general.get("lookup_share", 0.0)
            if not 0.0 <= share < 1.0:
                raise ValueError(f"config.base.general.lookup_share={share}: the share of "
                                 "lookup items must be in [0, 1)")  # fmt: skip
            importlib.import_module("launch.sft").build(base)
            if base.evaluation.sets:
                importlib.import_module("launch.eval").build(base.evaluation)
    return wired


def main(argv):
    del argv
    import jax

    from hat_jax import host_memory, sharding

    _logs.quiet()
    sharding.initialize_distributed()
    if jax.process_count() > 1:
        sys.exit("pipeline: one machine only; on a cluster run python -m launch.<stage> per stage")
    host_memory.retain_freed_memory()  # CPU: no page faults re-touching each step's buffers
    c = _FLAGS["config"].value
    build(c, run_dir=_FLAGS["workdir"].value)
    try:
        manifest = _pipeline.run_pipeline(c, workdir=_FLAGS["workdir"].value,
                                          only=_FLAGS["stages"].value, fresh=_FLAGS["fresh"].value)  # fmt: skip
    except _pipeline.StageFailed as e:
        sys.exit(f"pipeline: {e}")
    print(f"pipeline: {manifest['status']}; manifest {manifest['workdir']}/{_pipeline.MANIFEST}")


if __name__ == "__main__":
    from ml_collections import config_flags

    _FLAGS["config"] = config_flags.DEFINE_config_file(
        "config", "configs/pipeline_demo.py", lock_config=True
    )
    _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Overrides config.workdir.")
    _FLAGS["stages"] = flags.DEFINE_string("stages", None, "Run only these (e.g. sft,opd).")
    _FLAGS["fresh"] = flags.DEFINE_bool("fresh", False, "Delete the workdir first.")
    app.run(main)
