"""A progress bar on the main process (tqdm), silent elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import jax

SHOWN = ("loss", "grad_norm", "learning_rate")


class Progress:
    """Shows steps done, rate and the latest main metrics; a no-op on non-main processes."""

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        desc: str = "train",
        unit: str = "step",
        enabled: bool = True,
    ):
        self._bar = None
        if enabled and jax.process_index() == 0:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit=unit,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )

    def update(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
        if self._bar is None:
            return
        self._bar.update(step - self._bar.n)
        if metrics:
            shown = {k: f"{float(metrics[k]):.4g}" for k in SHOWN if k in metrics}
            self._bar.set_postfix(shown, refresh=False)

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message)
        elif jax.process_index() == 0:
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
