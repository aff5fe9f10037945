"""PNG plots of a run's curves, drawn from its `metrics.jsonl`.

`plot_metrics(run_dir)` writes `<run>/plots/<name>.png` for each metric (training and, when
present, the `eval/` series of the same name on the same axes) and `<run>/plots/overview.png`
with the main curves side by side; `overview_only=True` draws just the latter (cheap enough
to refresh at every checkpoint). Files are written atomically; figures are drawn with the Agg
canvas directly (no pyplot state), so plotting works on headless machines and threads.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections import defaultdict

from hat_jax import files
from hat_jax.metrics._writer import read_metrics

PLOTS_DIR = "plots"
OVERVIEW = ("loss", "grad_norm", "learning_rate", "accuracy")


def _series(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    series: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for record in records:
        for name, value in record.items():
            if name in ("step", "time") or not isinstance(value, int | float):
                continue
            steps, values = series[name]
            steps.append(record["step"])
            values.append(float(value))
    return dict(series)


def _figure(width: float, height: float, columns: int = 1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="tight")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, columns, squeeze=False)[0]


def _save(fig, path: pathlib.Path) -> None:
    with files.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


def _draw(ax, series, name: str) -> None:
    for label, key in (("train", name), ("eval", f"eval/{name}")):
        if key in series:
            steps, values = series[key]
            style = "-" if label == "train" else "o-"
            ax.plot(steps, values, style, label=label, markersize=3, linewidth=1.2)
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if f"eval/{name}" in series:
        ax.legend()


def plot_metrics(run_dir: os.PathLike | str, *, overview_only: bool = False) -> list[pathlib.Path]:
    """Draws the run's curves; returns the PNG paths written (none without records)."""
    run_dir = pathlib.Path(run_dir)
    series = _series(read_metrics(run_dir))
    names = sorted({n.removeprefix("eval/") for n in series})
    if not names:
        return []
    out_dir = run_dir / PLOTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in [] if overview_only else names:
        fig, (ax,) = _figure(5, 3.2)
        _draw(ax, series, name)
        path = out_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"
        _save(fig, path)
        written.append(path)
    main = [n for n in OVERVIEW if n in names] or names[:4]
    fig, axes = _figure(4.2 * len(main), 3.2, len(main))
    for ax, name in zip(axes, main):
        _draw(ax, series, name)
    _save(fig, out_dir / "overview.png")
    return [*written, out_dir / "overview.png"]
