"""The checkout as an OpenEnv environment (``openenv.yaml`` at its root, ``openenv validate .``): OpenEnv's
``server`` entry point serves one trace-gym env with `trace-gym serve` (every guard of the env server: Host
names, tokens off loopback, body and connection limits), configured by environment variables, which is how an
OpenEnv Space passes settings (``variables:`` in ``openenv.yaml``):

====================  =================================================================================
``TRACE_GYM_ENV``       the env spec (default ``trace/Arithmetic-v0``)
``TRACE_GYM_ENV_ARGS``  its keyword arguments as a JSON object (default ``{}``)
``HOST``, ``PORT``      the address to bind (default ``127.0.0.1``, ``8000``, OpenEnv's port); any address but
                        loopback needs ``TRACE_GYM_SERVE_TOKEN`` (a Space secret)
====================  =================================================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["main", "serve_argv"]

DEFAULT_ENV = "trace/Arithmetic-v0"


def serve_argv(environ: Mapping[str, str]) -> list[str]:
    """The ``trace-gym serve`` arguments that ``environ`` asks for (module docstring)."""
    return ["serve", "--env", environ.get("TRACE_GYM_ENV", DEFAULT_ENV),
            "--env-args", environ.get("TRACE_GYM_ENV_ARGS", "{}"),
            "--host", environ.get("HOST", "127.0.0.1"), "--port", environ.get("PORT", "8000")]


def main() -> int:
    """OpenEnv's ``server`` entry point: `trace-gym serve` as the environment variables ask."""
    from trace_gym.training.cli.main import main as cli

    return cli([*serve_argv(os.environ), *sys.argv[1:]])
