"""The miniature reproduction of the paper's Table 3: every arm trained (shared stages once),
evaluated on the same set versions, compared with paired bootstrap intervals.

  make reproduce  =  python -m launch.reproduce --config=configs/reproduce.py
  python -m launch.reproduce --config=configs/reproduce.py --config.arms=base,fixed_sft,hsa_sft

Each arm is a `launch.pipeline` run under `<workdir>/<arm>` (resumable: a rerun skips complete
stages and resumes an interrupted one). `<workdir>/report.md` holds the table, the plot and the
verdict on each of the paper's effects; `<workdir>/reproduce.json` the same as data. A failed
stage is named on stderr and in the manifest, and the exit status is 1.
"""

import pathlib
import sys

from absl import app, flags

from launch import _logs, _pipeline, _reproduce
from launch import pipeline as pipeline_launch

_FLAGS: dict = {}


def build(c, *, run_dir: str | None = None) -> dict:
    """Every arm's pipeline config, each checked by `launch.pipeline.build` (every stage's own
    launch module). Returns `{arm: config}`."""
    for key in ("resamples", "seed", "level_margin", "min_effectiveness"):
        if key not in c:
            raise ValueError(f"config.{key} is missing (see configs/reproduce.py)")
    if c.resamples < 100 or not 0 < c.level_margin < 1:
        raise ValueError(f"config: resamples >= 100 and 0 < level_margin < 1, got "
                         f"resamples={c.resamples}, level_margin={c.level_margin}")  # fmt: skip
    configs = _reproduce.node_configs(c, pathlib.Path(run_dir or c.workdir))
    t = c.edit_test
    if t.arms:
        from launch import _edit_test

        missing = [a for a in t.arms.split(",") if a.strip() not in configs]
        if missing:
            raise ValueError(f"config.edit_test.arms: {missing} are not among config.arms")
        if t.dev_cases < 1 or t.heldout_cases < 1:
            raise ValueError(f"config.edit_test: dev_cases and heldout_cases >= 1, got "
                             f"{t.dev_cases} and {t.heldout_cases}")  # fmt: skip
        _edit_test.check_candidates(t.candidates)
        if c.pipeline.get("room", "v0") != "v0":  # its cases and candidate edits are v0's
            raise ValueError(f"config.edit_test runs on Harness v0's cases and edits; the arms "
                             f"train in the {c.pipeline.room!r} live room: set "
                             "config.edit_test.arms='' (planned: the test in the micro room)")  # fmt: skip
    for p in configs.values():
        pipeline_launch.build(p, run_dir=p.workdir)
    return configs


def main(argv):
    del argv
    import jax

    from hat_jax import host_memory, sharding

    _logs.quiet()
    sharding.initialize_distributed()
    if jax.process_count() > 1:
        sys.exit("reproduce: one machine only")
    host_memory.retain_freed_memory()
    c = _FLAGS["config"].value
    build(c, run_dir=_FLAGS["workdir"].value)
    try:
        manifest = _reproduce.run_reproduce(c, workdir=_FLAGS["workdir"].value,
                                            fresh=_FLAGS["fresh"].value)  # fmt: skip
    except _pipeline.StageFailed as e:
        sys.exit(f"reproduce: {e}")
    root = pathlib.Path(manifest["workdir"])
    for e in manifest["effects"]:
        print(f"reproduce: {e['verdict']:>10}: {e['effect']}")
    print(f"reproduce: {manifest['status']}; report {root / 'report.md'}")


if __name__ == "__main__":
    from ml_collections import config_flags

    _FLAGS["config"] = config_flags.DEFINE_config_file(
        "config", "configs/reproduce.py", lock_config=True
    )
    _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Overrides config.workdir.")
    _FLAGS["fresh"] = flags.DEFINE_bool("fresh", False, "Delete the workdir first.")
    app.run(main)
