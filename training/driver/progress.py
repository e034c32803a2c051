"""What a run reports while it goes: stage timers, the progress bar, and the plots at its end."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


class StageTimer:
    """``with timer("stage"):`` accumulates ``time/<stage>_s``; `metrics()` adds ``time/step_s`` since creation."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def __call__(self, name: str) -> StageTimer:
        self._name, self._start = name, time.perf_counter()
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._start

    def metrics(self) -> dict[str, float]:
        out = {f"time/{k}_s": v for k, v in self.times.items()}
        out["time/step_s"] = time.perf_counter() - self.t0
        return out


class StepProgress:
    """A rich progress bar over steps showing a few headline metrics, or nothing when not ``enabled``."""

    KEYS = (("rollout/success", "succ"), ("alloc/effective_ratio", "eff"), ("eval/success", "eval"))

    def __init__(self, enabled: bool, total: int, done: int, console: Any):
        self.enabled, self.total, self.done, self.console = enabled, total, done, console
        self.shown: dict[str, float] = {}

    def __enter__(self) -> Callable[[Mapping[str, Any]], None]:
        if not self.enabled:
            return lambda metrics: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                            TimeRemainingColumn(), console=self.console)
        self.bar.start()
        self.task = self.bar.add_task("train", total=self.total, completed=self.done, info="")
        return self._advance

    def _advance(self, metrics: Mapping[str, Any]) -> None:
        for key, short in self.KEYS:
            if key in metrics and isinstance(metrics[key], float) and not math.isnan(metrics[key]):
                self.shown[short] = metrics[key]
        info = "  ".join(f"{k} {v:.3f}" for k, v in self.shown.items())
        self.bar.update(self.task, advance=1, info=info)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()


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
