"""``trace-gym view`` and ``trace-gym plot``: the dispatcher (``cli/main.py``) calls ``add_arguments`` to build
each sub-command's parser and ``run`` to execute it (exit status returned)."""

from __future__ import annotations

import argparse
from pathlib import Path

COMMANDS = ("view", "plot")


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Arguments of ``command`` ("view" or "plot")."""
    if command == "view":
        parser.description = "Write rollout trees (JSONL of RolloutTree dicts) as one self-contained HTML page."
        parser.add_argument("trees", nargs="+", type=Path,
                            help="trees.jsonl file(s), or run folders whose *.jsonl files hold trees")
        parser.add_argument("--out", type=Path, default=None,
                            help="HTML file to write (default: the first input with .html, or DIR/trees.html)")
        parser.add_argument("--title", default=None, help="page title (default: the input file names)")
    elif command == "plot":
        parser.description = "Write PNG plots of run metrics (RUN_DIR/metrics.jsonl); several runs are overlaid."
        parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folder(s)")
        parser.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: RUN_DIR/plots)")
    else:
        raise ValueError(f"expected a command in {COMMANDS}, got {command!r}")


def _default_page(first: Path) -> Path:
    return first / "trees.html" if first.is_dir() else first.with_suffix(".html")


def run(command: str, args: argparse.Namespace) -> int:
    """Execute ``command``; returns the exit status. Bad input raises ``ConfigError``, which the dispatcher prints
    as one line (exit status 2)."""
    if command == "view":
        from trace_gym.training.viz.viewer import write_viewer

        out = write_viewer(args.trees, args.out or _default_page(args.trees[0]), title=args.title)
        print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB); open it in a browser (works offline)")
        return 0
    if command == "plot":
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
    raise ValueError(f"expected a command in {COMMANDS}, got {command!r}")


def main(argv: list[str] | None = None) -> int:
    """``python -m trace_gym.training.cli.views view ...``: the same as ``trace-gym view ...``."""
    from trace_gym.training.cli.main import main as trace_gym_main

    return trace_gym_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
