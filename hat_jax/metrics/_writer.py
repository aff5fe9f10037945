"""Metrics of a run: one JSONL record per logged step and TensorBoard scalars.

Only the main process writes. `<run>/metrics.jsonl` holds `{"step", "time", <name>: value}`
records (evaluation metrics are prefixed `eval/`); `<run>/tensorboard/` holds the same as
TensorBoard events. A resumed run calls `rewind(step)` so that records written after the
checkpoint it resumed from are dropped (JSONL) or purged (TensorBoard): the files then read
as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from collections.abc import Mapping

import jax

from hat_jax import files

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_metrics(path: os.PathLike | str) -> list[dict]:
    """The records of a `metrics.jsonl` (or a run directory holding one), in file order."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not a JSON record: {err}") from err
    return records


def _jsonable(value) -> float | int | None:
    value = float(value) if not isinstance(value, int | bool) else int(value)
    return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricsWriter:
    """Writes scalar metrics to JSONL and TensorBoard (on the main process only).

    Args:
      run_dir: the run directory.
      tensorboard: also write TensorBoard events.
    """

    def __init__(self, run_dir: os.PathLike | str, *, tensorboard: bool = True):
        self.run_dir = pathlib.Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = jax.process_index() == 0
        self._tensorboard = tensorboard
        self._tb = None
        self._file = None
        if self.enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._open(purge_step=None)

    def _open(self, purge_step: int | None) -> None:
        self._file = self.path.open("a")
        if self._tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR), purge_step=purge_step)

    def write(self, step: int, metrics: Mapping[str, float], *, prefix: str = "") -> None:
        """Appends one record; non-finite values are written as JSON null."""
        if not self.enabled:
            return
        values = {f"{prefix}{k}": _jsonable(v) for k, v in metrics.items()}
        record = {"step": int(step), "time": round(time.time(), 3), **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, float("nan") if value is None else value, int(step))

    def rewind(self, step: int) -> None:
        """Drops everything logged after `step` (for a run resumed from that step)."""
        if not self.enabled:
            return
        self.close()
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        files.write_jsonl(self.path, (json.dumps(r) for r in kept))
        self._open(purge_step=step + 1)

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
