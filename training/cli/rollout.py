"""``trace-gym rollout``: any policy (``--policy SPEC``; by default the env's scripted expert with noise 0.3) on
the env's first ``--tasks`` tasks, each task's tree continued ``--branches`` times from uniformly chosen visited
turns: with a noisy expert the trees have mixed outcomes, which is what allocation and tree advantages feed on.
It shares its options, its rollouts and its report with ``trace-gym eval`` (``trace_gym.training.cli.play``); the
trees go to ``--out`` as JSONL for ``trace-gym view``.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from trace_gym.training.cli import play


def add_arguments(parser: argparse.ArgumentParser) -> None:
    play.add_arguments("rollout", parser)


def run(args: argparse.Namespace) -> int:
    return play.run("rollout", args, Console())
