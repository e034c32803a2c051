"""``trace-gym plot``: PNG plots of run metrics (RUN_DIR/metrics.jsonl), several runs overlaid
(`trace_gym.training.viz.plots`). Bad input raises ``ConfigError``, which the dispatcher prints as one line."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Write PNG plots of run metrics (RUN_DIR/metrics.jsonl); several runs are overlaid."
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folder(s)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: RUN_DIR/plots)")


def run(args: argparse.Namespace) -> int:
    from trace_gym.training.viz.plots import plot_runs

    result = plot_runs(args.run_dirs, args.out)
    for path in result.paths:
        print(f"wrote {path}")
    for panel, keys in result.missing.items():
        print(f"no {panel} plot: the run logged none of {', '.join(keys)}")
    for r in result.runs:
        if r.skipped_lines:
            print(f"skipped {r.skipped_lines} unreadable line(s) of {r.path / 'metrics.jsonl'}")
    return 0
