"""``trace-gym serve``: one env on OpenEnv's protocol, with branching (`trace_gym.integrations.env_server`)."""

from __future__ import annotations

import argparse

from trace_gym.integrations import serve_command


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    serve_command.add_arguments(parser)


def run(command: str, args: argparse.Namespace) -> int:
    return serve_command.run(args)
