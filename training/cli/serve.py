"""``trace-gym serve``: one env on OpenEnv's protocol, with branching (`trace_gym.integrations.env_server`). The
server's packages are imported only when it runs, so ``trace-gym serve --help`` works without the serve extra;
the server never imports this command.

The checkout as an OpenEnv environment (``openenv.yaml`` at its root, ``openenv validate .``): OpenEnv's
``server`` entry point (`main`) is this command configured by environment variables, which is how an
OpenEnv Space passes settings (``variables:`` in ``openenv.yaml``):

======================  =================================================================================
``TRACE_GYM_ENV``       the env spec (default ``trace/Arithmetic-v0``)
``TRACE_GYM_ENV_ARGS``  its keyword arguments as a JSON object (default ``{}``)
``HOST``, ``PORT``      the address to bind (default ``127.0.0.1``, ``8000``, OpenEnv's port); any address but
                        loopback needs ``TRACE_GYM_SERVE_TOKEN`` (a Space secret)
======================  =================================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_gym.env_specs import parse_env_args
from trace_gym.errors import ConfigError

__all__ = ["TOKEN_VARIABLE", "add_arguments", "env_arguments", "main", "read_tokens", "run", "serve_argv"]

TOKEN_VARIABLE = "TRACE_GYM_SERVE_TOKEN"
DEFAULT_ENV = "trace/Arithmetic-v0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", required=True, help="the env to serve: a registered id (trace-gym envs), "
                                                     "module:id or module:Class")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a keyword argument of the env, the value read as YAML (n_tasks=100), as trace-gym eval "
                             "takes it; repeat for several")
    parser.add_argument("--env-args", default="{}", metavar="JSON",
                        help="its constructor's arguments as one JSON object (joined with --env-arg)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback only by default; "
                                                            "anything else needs a token)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token-file", help="a file of tokens, one a line (each client its own); also "
                                             f"${TOKEN_VARIABLE}")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="another Host name clients use to reach the server (repeatable)")
    parser.add_argument("--max-live", type=int, help="live sessions and snapshot handles at most (default: this "
                                                     "host's budget; only lower)")
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds to send a whole request")
    parser.add_argument("--session-idle", type=float, default=600.0, help="seconds before an unused session closes")


def read_tokens(path: str | None) -> list[str]:
    """The tokens of ``path`` (one a line, ``#`` comments) and of ``$TRACE_GYM_SERVE_TOKEN``; the file must not be
    readable by other users."""
    tokens = [os.environ[TOKEN_VARIABLE].strip()] if os.environ.get(TOKEN_VARIABLE, "").strip() else []
    if path is None:
        return tokens
    file = Path(path)
    try:
        mode = file.stat().st_mode
        lines = file.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"expected a readable token file, got {path} ({exc.strerror}); fix: write the tokens "
                          "there, one a line") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"expected {path} to be readable by its owner only, got mode {stat.filemode(mode)}; "
                          f"fix: chmod 600 {path}")
    tokens += [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    if not tokens:
        raise ConfigError(f"expected at least one token in {path}, got none; fix: python -c 'import secrets; "
                          f"print(secrets.token_urlsafe(32))' >> {path}")
    return tokens


def env_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The env's keyword arguments: ``--env-args`` (a JSON object) joined with each ``--env-arg KEY=VALUE``; a key
    given by both is a mistake."""
    try:
        env_args = json.loads(args.env_args)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"expected --env-args as a JSON object, got {args.env_args!r} ({exc})") from None
    if not isinstance(env_args, dict):
        raise ConfigError(f"expected --env-args as a JSON object, got {type(env_args).__name__}; fix: e.g. "
                          "'{\"n_tasks\": 100}'")
    pairs = parse_env_args(args.env_arg)
    both = sorted(set(pairs) & set(env_args))
    if both:
        raise ConfigError(f"expected each env argument once, got {', '.join(both)} in both --env-args and "
                          "--env-arg; fix: give it in one of them")
    return {**env_args, **pairs}


def run(args: argparse.Namespace) -> int:
    """Serve ``args`` in the foreground until interrupted."""
    from trace_gym.integrations.env_server import EnvServer, ServeLimits

    env_args = env_arguments(args)
    limits = ServeLimits(max_live=args.max_live, max_connections=args.max_connections,
                         request_timeout_s=args.request_timeout, session_idle_s=args.session_idle)
    server = EnvServer(args.env, env_args, host=args.host, port=args.port, tokens=read_tokens(args.token_file),
                       allow_hosts=args.allow_host, limits=limits)
    print(f"trace-gym env server for {args.env} at {server.url} (up to {server.budget.limit} live sessions and "
          "snapshots)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


def serve_argv(environ: Mapping[str, str]) -> list[str]:
    """The ``trace-gym serve`` arguments that ``environ`` asks for (module docstring)."""
    return ["serve", "--env", environ.get("TRACE_GYM_ENV", DEFAULT_ENV),
            "--env-args", environ.get("TRACE_GYM_ENV_ARGS", "{}"),
            "--host", environ.get("HOST", "127.0.0.1"), "--port", environ.get("PORT", "8000")]


def main() -> int:
    """OpenEnv's ``server`` entry point: `trace-gym serve` as the environment variables ask."""
    from trace_gym.training.cli.main import main as trace_gym

    return trace_gym([*serve_argv(os.environ), *sys.argv[1:]])
