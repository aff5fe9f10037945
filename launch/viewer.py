"""The trajectory viewer and blind pairwise test, a local web app (no external assets).

  python -m launch.viewer --runs runs/eval/sft --runs runs/sim/teacher     # browse and filter
  python -m launch.viewer --report runs/evolve/round-1                     # + failure clusters
  python -m launch.viewer --blind runs/eval/sft,runs/eval/hat \
      --blind_dir runs/blind/sft-vs-hat                                    # label A, B or tie

Runs are evaluation runs (`items/`), simulator runs (`trajectories.jsonl`) or replay runs
(`requests.jsonl`); the report's runs are loaded with it. A blind session's labels are saved
in `--blind_dir` as they are made; rerunning with the same folder resumes it (same order and
sides). Open the printed address in a browser; the result page links the JSON export.
"""

from absl import app, flags

from launch import _logs

_RUNS = flags.DEFINE_multi_string("runs", [], "Run directories (repeat, or comma-separated).")
_REPORT = flags.DEFINE_string("report", None, "An evolution report dir (its failures.json).")
_BLIND = flags.DEFINE_list("blind", [], "Two run directories to compare blind: A_DIR,B_DIR.")
_BLIND_DIR = flags.DEFINE_string(
    "blind_dir", None, "The blind session's folder (default: runs/blind/<a>-vs-<b>)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of a new blind session's order and sides.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
_PORT = flags.DEFINE_integer("port", 8765, "Port to listen on.")


def main(argv):
    del argv
    _logs.quiet()
    import uvicorn

    from serve import viewer as vw

    runs = [p for value in _RUNS.value for p in value.split(",") if p]
    if _BLIND.value and len(_BLIND.value) != 2:
        raise app.UsageError(f"--blind takes two run directories, got {_BLIND.value}")
    if not (runs or _REPORT.value or _BLIND.value):
        raise app.UsageError("give --runs, --report or --blind")
    try:
        viewer = vw.load_viewer(
            runs, report_dir=_REPORT.value, blind=tuple(_BLIND.value) or None,
            blind_dir=_BLIND_DIR.value, seed=_SEED.value,
        )  # fmt: skip
    except vw.BlindError as err:
        raise app.UsageError(str(err)) from None
    for run in viewer.runs:
        print(f"{run.path}: {run.kind}, {len(run.entries)} entries, {len(run.problems)} problems")
    if viewer.blind is not None:
        labels = len(viewer.blind.labels())
        print(f"blind session {viewer.blind.folder}: {len(viewer.blind.pairs)} pairs, "
              f"{labels} labelled")  # fmt: skip
    if _HOST.value not in ("127.0.0.1", "localhost", "::1"):
        print(f"serving on {_HOST.value}: anyone who can reach it can read the runs and label")
    print(f"viewer on http://{_HOST.value}:{_PORT.value}/")
    uvicorn.run(vw.create_viewer_app(viewer), host=_HOST.value, port=_PORT.value,
                log_level="warning")  # fmt: skip


if __name__ == "__main__":
    app.run(main)
