"""The ``trace-gym`` command. Each subcommand COMMAND is the module ``trace_gym.training.cli.COMMAND`` (its
``add_arguments(parser)`` and ``run(args)``), imported only when run, so ``trace-gym envs`` never imports torch.

A user's mistake (``trace_gym.errors.UserError``: a bad setting, a missing file, a server that is down, a
missing optional package) is printed as one line, ``error: ...; fix: ...``, with exit status 2; ``--debug``
(anywhere on the command line, or ``TRACE_GYM_DEBUG=1``) shows the traceback instead. Other exceptions are
bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from trace_gym import threads
from trace_gym.errors import UserError

# command -> one-line help; the command's module is trace_gym.training.cli.<command>
COMMANDS: dict[str, str] = {
    "envs": "list the registered trace/* environments with their tools and datasets",
    "rollout": "roll out a policy with the tree wrapper and save the trees as JSONL",
    "model": "build the tiny model (model init --out DIR) or fetch a pretrained one (model fetch smollm2-135m)",
    "sft": "supervised warm start on scripted-expert trajectories",
    "train": "train with TRACE or a baseline allocator from a YAML config",
    "eval": "evaluate any policy, or a run's checkpoint, on an env (success, 95% interval)",
    "view": "write a self-contained HTML page of rollout trees",
    "plot": "write PNG plots of a training run's metrics",
    "serve": "serve an env on OpenEnv's protocol, with snapshot, restore and branch",
}

# Optional packages -> the extra that installs them (a missing one is the user's to install, not a bug).
OPTIONAL = {"torch": "train", "transformers": "train", "tokenizers": "train", "peft": "train",
            "accelerate": "train", "matplotlib": "train", "ray": "ray", "vllm": "vllm"}

EXIT_USER_ERROR = 2


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {doc}" for name, doc in COMMANDS.items()]
    return "usage: trace-gym COMMAND [options] [--debug]\n\ncommands:\n" + "\n".join(lines) + "\n\n" \
        "Run 'trace-gym COMMAND --help' for a command's options; --debug shows the traceback of an error."


def one_line(message: str) -> str:
    """``message`` with every run of whitespace (newlines included) as one space."""
    return " ".join(message.split())


def missing_package(exc: ModuleNotFoundError) -> str | None:
    """The fix for an optional package that is not installed, or None when ``exc`` is about another module."""
    root = (exc.name or "").split(".")[0]
    if root not in OPTIONAL:
        return None
    extra = OPTIONAL[root]
    first = "pip install torch==2.13.0 (first and alone: pip otherwise takes a CUDA build), then " \
        if extra == "train" else ""
    return f"expected the package {root!r} (trace-gym[{extra}]), got none installed; fix: {first}" \
        f"pip install -e '.[{extra}]' (or make venv)"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help where there is a default worth showing (not for required
    options, flags, or None)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trace-gym ARGV``; returns the exit status (0 ok, 2 a user error or bad usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("TRACE_GYM_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        from trace_gym.errors import did_you_mean

        print(f"error: unknown command {command!r}; fix: {did_you_mean(command, COMMANDS)}one of "
              f"{', '.join(COMMANDS)} (trace-gym --help)", file=sys.stderr)
        return EXIT_USER_ERROR
    # transformers and huggingface_hub draw their own tqdm bars (weight loading, downloads): they would tear
    # through our rich progress bars. Both read this variable when they are first imported.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # vLLM logs to stdout by default; a command's stdout is its output (tables, --json), so logs go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    # torch's thread pool is sized when torch loads: choose it for the cores this process may use first.
    threads.configure()
    try:
        module = importlib.import_module(f"trace_gym.training.cli.{command}")
        parser = argparse.ArgumentParser(prog=f"trace-gym {command}", description=COMMANDS[command],
                                         formatter_class=HelpFormatter)
        module.add_arguments(parser)
        return int(module.run(parser.parse_args(rest)) or 0)
    except UserError as exc:
        if debug:
            raise
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except ModuleNotFoundError as exc:
        fix = missing_package(exc)
        if fix is None or debug:
            raise
        print(f"error: {fix}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"trace-gym {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
