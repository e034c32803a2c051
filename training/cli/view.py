"""``trace-gym view``: rollout trees (JSONL of RolloutTree dicts) as one self-contained HTML page
(`trace_gym.training.viz.viewer`). Bad input raises ``ConfigError``, which the dispatcher prints as one line."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Write rollout trees (JSONL of RolloutTree dicts) as one self-contained HTML page."
    parser.add_argument("trees", nargs="+", type=Path,
                        help="trees.jsonl file(s), or run folders whose *.jsonl files hold trees")
    parser.add_argument("--out", type=Path, default=None,
                        help="HTML file to write (default: the first input with .html, or DIR/trees.html)")
    parser.add_argument("--title", default=None, help="page title (default: the input file names)")


def _default_page(first: Path) -> Path:
    return first / "trees.html" if first.is_dir() else first.with_suffix(".html")


def run(args: argparse.Namespace) -> int:
    from trace_gym.training.viz.viewer import write_viewer

    out = write_viewer(args.trees, args.out or _default_page(args.trees[0]), title=args.title)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB); open it in a browser (works offline)")
    return 0
