"""Metrics sinks: ``metrics.jsonl`` and ``train.log`` in the run folder always; TensorBoard and W&B only when
asked and installed.

``metrics.jsonl``: one JSON object per line, ``{"step": n, "alloc/effective_ratio": ..., ...}``; NaN becomes
null. ``train.log``: one plain line per logged step (time, step and the headline metrics), to follow a run with
``tail -f`` whatever the terminal shows.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        return _clean(value.item())
    return value


class MetricsLogger:
    """`log(step, metrics)` appends to metrics.jsonl (and scalar metrics to TensorBoard/W&B if enabled).

    `truncate_after` drops lines of later steps left by an interrupted run, so a resumed run's file reads
    like an uninterrupted one.
    """

    def __init__(self, run_dir: str | Path, cfg: Any, config: dict[str, Any] | None = None,
                 truncate_after: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.text_path = Path(run_dir) / "train.log"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= truncate_after]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._tb = self._wandb = None
        if getattr(cfg, "tensorboard", False):
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:
                warnings.warn("log.tensorboard is set but tensorboard is not installed; fix: pip install "
                              "tensorboard. Logging to metrics.jsonl only.", stacklevel=2)
        if getattr(cfg, "wandb", False):
            try:
                import wandb  # type: ignore[import-not-found]

                self._wandb = wandb.init(project=cfg.wandb_project, config=config, dir=str(run_dir))
            except ImportError:
                warnings.warn("log.wandb is set but wandb is not installed; fix: pip install wandb. "
                              "Logging to metrics.jsonl only.", stacklevel=2)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **_clean(metrics)}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        with open(self.text_path, "a") as f:
            f.write(log_line(row) + "\n")
        scalars = {k: v for k, v in row.items() if k != "step" and isinstance(v, int | float)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


# The metrics a train.log line shows, in order, when a step has them.
_HEADLINE = ("rollout/success", "alloc/effective_ratio", "loss/total", "eval/success", "eval/tool_use",
             "eval/expert_prob", "time/step_s")


def log_line(row: dict[str, Any]) -> str:
    """``2026-12-02 06:40:01 step 3 | rollout/success 0.512 | ...``: a step's headline metrics as plain text."""
    parts = [f"{k} {row[k]:.4g}" if isinstance(row[k], float) else f"{k} {row[k]}"
             for k in _HEADLINE if row.get(k) is not None]
    return " | ".join([time.strftime("%Y-%m-%d %H:%M:%S") + f" step {row['step']}", *parts])


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
