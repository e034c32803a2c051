"""The ``trace-gym`` command. Each subcommand lives in the module that owns it and is imported only when run,
so ``trace-gym envs`` never imports torch."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# command -> (module exposing add_arguments(command, parser) and run(command, args), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("trace_gym.rollout", "list the registered trace/* environments with their tools and datasets"),
    "rollout": ("trace_gym.rollout", "roll out a policy with the tree wrapper and save the trees as JSONL"),
    "model": ("trace_gym.agents.cli", "build the tiny embedded model: model init --out DIR"),
    "sft": ("trace_gym.training.warm_start", "supervised warm start on scripted-expert trajectories"),
    "train": ("trace_gym.training.cli", "train with TRACE or a baseline allocator from a YAML config"),
    "eval": ("trace_gym.training.cli", "evaluate a model on an environment's held-out tasks"),
    "view": ("trace_gym.training.viz_cli", "write a self-contained HTML page of rollout trees"),
    "plot": ("trace_gym.training.viz_cli", "write PNG plots of a training run's metrics"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {doc}" for name, (_, doc) in COMMANDS.items()]
    return "usage: trace-gym COMMAND [options]\n\ncommands:\n" + "\n".join(lines) + "\n\n" \
        "Run 'trace-gym COMMAND --help' for a command's options."


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"trace-gym: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    parser = argparse.ArgumentParser(prog=f"trace-gym {command}", description=COMMANDS[command][1])
    module.add_arguments(command, parser)
    return int(module.run(command, parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
