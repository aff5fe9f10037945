"""Quiet output for every launch script: library logs (the checkpoint library's INFO lines,
...) at WARNING unless the user asks for them with absl's `--verbosity` (`-v 0` for INFO), so
a run prints its own progress and summary lines. Light on purpose: scripts that never touch
JAX import it too."""

from __future__ import annotations


def quiet() -> None:
    """absl's logging at WARNING, unless `--verbosity` was given on the command line."""
    from absl import flags
    from absl import logging as absl_logging

    if not flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
