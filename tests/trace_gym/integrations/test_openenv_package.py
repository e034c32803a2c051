"""The checkout is an OpenEnv environment: OpenEnv's own validator passes it, and its ``server`` entry point (what
``openenv.yaml`` and the pyproject's ``[project.scripts] server`` name) serves the env its environment variables
name, on a real port."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest
import yaml

from trace_gym.training.cli.serve import serve_argv

ROOT = Path(__file__).resolve().parents[3]
OPENENV = shutil.which("openenv", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(OPENENV is None, reason="needs openenv-core's CLI (pip install -e '.[openenv]')")
def test_openenv_validate_passes_on_the_checkout():
    result = subprocess.run([OPENENV, "validate", str(ROOT), "--json"], capture_output=True, text=True, timeout=600)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["passed"] and report["issues"] == [], result.stdout + result.stderr


def test_the_manifest_and_the_entry_point_name_the_same_server():
    manifest = yaml.safe_load((ROOT / "openenv.yaml").read_text())
    assert manifest["name"] and manifest["port"] == int(manifest["variables"]["PORT"])
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["server"]
    module, _, name = entry.partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_environment_variables_become_the_serve_flags():
    assert serve_argv({}) == ["serve", "--env", "trace/Arithmetic-v0", "--env-args", "{}", "--host", "127.0.0.1",
                              "--port", "8000"]
    argv = serve_argv({"TRACE_GYM_ENV": "trace/GSM8K-v0", "TRACE_GYM_ENV_ARGS": '{"max_turns": 3}', "PORT": "9"})
    assert argv[2:6] == ["trace/GSM8K-v0", "--env-args", '{"max_turns": 3}', "--host"] and argv[-1] == "9"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_server_module_serves_the_named_env_on_its_port():
    port = _free_port()
    env = {**os.environ, "TRACE_GYM_ENV_ARGS": '{"n_tasks": 2}', "HOST": "127.0.0.1", "PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "server/app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert f"127.0.0.1:{port}" in first and "trace/Arithmetic-v0" in first, first
        health: dict = {}
        deadline = time.monotonic() + 120  # the line comes before uvicorn accepts; a bound on the wait, not a check
        while not health and time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
            except httpx.TransportError:
                time.sleep(0.2)
        assert health.get("status") == "healthy"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
