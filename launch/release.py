"""Release gates: a candidate checkpoint with its evaluation and deployment replay is released
only if both runs were made with it (the checkpoint digests they recorded equal its own, see
`serve.digest`) and it passes the latency, business and general-capability gates (see
`serve.release`). The business floors refuse a policy whose every reply is the Hooks' fallback
(AVG 0.5, Effectiveness 0): `--min_business` 0.5 on each T1/T2 set's AVG and
`--min_effectiveness` 0.1 on its Effectiveness.

  python -m launch.release --checkpoint runs/demo/export/hf --eval_run runs/eval/demo \
      --replay_run runs/replay/demo [--registry runs/releases] [--serving serving.json]

Prints each gate's verdict and figures; a refused candidate exits with status 1 and the last
passing release stays current (`<registry>/current.json`).
"""

import json
import pathlib
import sys

from absl import app, flags

from serve.release import Candidate, GateConfig, current_release, release


def main(argv):
    del argv
    f = flags.FLAGS
    serving = json.loads(pathlib.Path(f.serving).read_text()) if f.serving else {}
    candidate = Candidate(checkpoint=f.checkpoint, eval_run=f.eval_run,
                          replay_run=f.replay_run, serving=serving, note=f.note)  # fmt: skip
    gates = GateConfig(min_attainment=f.min_attainment, min_business=f.min_business,
                       min_effectiveness=f.min_effectiveness,
                       min_general=f.min_general)  # fmt: skip
    record = release(candidate, registry=f.registry, gates=gates)
    for name in ("checkpoint", "latency", "business", "general"):
        gate = record["gates"][name]
        print(f"{name}: {'pass' if gate['passed'] else 'FAIL'} {gate['why']}".rstrip())
    if record["status"] != "released":
        current = current_release(f.registry)
        print(f"refused {record['id']}; current release stays "
              f"{current['id'] if current else 'none'}")  # fmt: skip
        sys.exit(1)
    print(f"released {record['id']} (checkpoint {candidate.checkpoint}, "
          f"{record['binds']['checkpoint_digest']})")  # fmt: skip


def _define_flags() -> None:
    for name, help_ in (
        ("checkpoint", "The candidate checkpoint."),
        ("eval_run", "Its launch.eval run directory."),
        ("replay_run", "Its launch.replay run directory."),
    ):
        flags.DEFINE_string(name, None, help_)
        flags.mark_flag_as_required(name)
    flags.DEFINE_string("registry", "runs/releases", "The release registry directory.")
    flags.DEFINE_string("serving", None, "A JSON file of the serving config (optional).")
    flags.DEFINE_string("note", "", "Free text for the record.")
    flags.DEFINE_float("min_attainment", 0.95, "Latency gate: attainment at top concurrency.")
    flags.DEFINE_float(
        "min_business", 0.5,
        "Business gate: floor of each T1/T2 set's mean AVG (0.5: the Hooks' fallback's).",
    )  # fmt: skip
    flags.DEFINE_float(
        "min_effectiveness", 0.1,
        "Business gate: floor of each T1/T2 set's mean Effectiveness (the fallback scores 0; "
        "0 turns the check off).",
    )  # fmt: skip
    flags.DEFINE_float("min_general", 0.0, "General gate: floor of each set's mean.")


_define_flags()

if __name__ == "__main__":
    app.run(main)
