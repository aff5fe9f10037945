"""Run metrics: JSONL records and TensorBoard events (`MetricsWriter`), PNG plots of the
curves (`plot_metrics`), a progress bar on the main process (`Progress`), and rater agreement
(`confusion_matrix`, `cohen_kappa`)."""

from hat_jax.metrics._agreement import cohen_kappa, confusion_matrix
from hat_jax.metrics._plots import plot_metrics
from hat_jax.metrics._progress import Progress
from hat_jax.metrics._writer import METRICS_FILE, MetricsWriter, read_metrics

__all__ = [
    "METRICS_FILE",
    "MetricsWriter",
    "Progress",
    "cohen_kappa",
    "confusion_matrix",
    "plot_metrics",
    "read_metrics",
]
