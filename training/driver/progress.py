"""What a run reports while it goes: the step progress, and the plots at its end."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trace_gym.progress import Progress


class StepProgress:
    """Progress over training steps (`trace_gym.progress.Progress`: a bar on a terminal, plain lines in a log)
    showing a few headline metrics, or nothing when not ``enabled``."""

    KEYS = (("rollout/success", "succ"), ("alloc/effective_ratio", "eff"), ("eval/success", "eval"))

    def __init__(self, enabled: bool, total: int, done: int, console: Any):
        self.progress = Progress("train", total=total, done=done, unit="step", console=console, enabled=enabled)

    def __enter__(self) -> Callable[[Mapping[str, Any]], None]:
        self.progress.__enter__()
        return self._advance

    def _advance(self, metrics: Mapping[str, Any]) -> None:
        shown = {short: metrics[key] for key, short in self.KEYS
                 if isinstance(metrics.get(key), float) and not math.isnan(metrics[key])}
        self.progress.update(advance=1, **shown)

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)


def plot_at_end(run_dir: Path, console: Any = None) -> list[Path]:
    """PNG plots of a finished run (training.plots); a failure is reported (console, else a warning), not
    raised: the run's results are already on disk and `trace-gym plot RUN_DIR` can retry."""
    try:
        from trace_gym.training.viz.plots import plot_run

        return plot_run(run_dir)
    except Exception as exc:  # any plotting failure (missing matplotlib, disk, odd rows) is not the run's
        text = f"plots of {run_dir} skipped: {type(exc).__name__}: {exc}; retry with `trace-gym plot {run_dir}`"
        if console is not None:
            console.print(text)
        else:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        return []
