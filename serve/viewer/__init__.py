"""The trajectory viewer and the blind pairwise test: a small local web app over run folders.

    python -m launch.viewer --runs runs/eval/sft --runs runs/sim --report runs/evolve/r1
    python -m launch.viewer --blind runs/eval/a,runs/eval/b --blind_dir runs/blind/a-vs-b

`load_viewer(run_dirs, report_dir=, blind=, blind_dir=, seed=)` reads evaluation, simulator and
replay runs (`read_run`: a damaged line is skipped and named), the evolution report's failure
clusters (`read_report`) and a blind session (`BlindSession`: seeded order, append-only fsynced
labels, the exact binomial test `binomial_two_sided`); `create_viewer_app(viewer)` is the
starlette app (HTML rendered on the server, no external asset).
"""

from serve.viewer._app import Viewer, create_viewer_app, load_viewer
from serve.viewer._blind import BlindError, BlindSession, binomial_two_sided
from serve.viewer._report import Report, read_report
from serve.viewer._runs import Entry, Run, read_run

__all__ = [
    "BlindError",
    "BlindSession",
    "Entry",
    "Report",
    "Run",
    "Viewer",
    "binomial_two_sided",
    "create_viewer_app",
    "load_viewer",
    "read_report",
    "read_run",
]
