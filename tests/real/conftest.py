"""Tests of a real pretrained model, SmolLM2-135M-Instruct as `trace-gym model fetch smollm2-135m` leaves it in
the cache (agents/fetch.py). They run wherever that folder exists and skip where it does not, unless
TRACE_GYM_REQUIRE_REAL=1 (set by `make test-real`, which fetches it first) makes its absence a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trace_gym.agents.fetch import DONE, cached_model

REQUIRED = os.environ.get("TRACE_GYM_REQUIRE_REAL") == "1"


def real_model() -> Path | None:
    folder = cached_model("smollm2-135m")
    return folder if (folder / DONE).is_file() else None


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if "tests/real" in str(item.fspath)]
    if not mine or real_model() is not None:
        return
    if REQUIRED:
        raise pytest.UsageError(f"TRACE_GYM_REQUIRE_REAL=1 but no fetched model at {cached_model('smollm2-135m')}; "
                                "fix: trace-gym model fetch smollm2-135m (make test-real does)")
    skip = pytest.mark.skip(reason="SmolLM2-135M not fetched (make test-real fetches it)")
    for item in mine:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def real_dir() -> Path:
    folder = real_model()
    assert folder is not None
    return folder


@pytest.fixture(scope="session")
def real_policy(real_dir):
    from trace_gym.agents.hf import HFPolicy

    return HFPolicy.from_pretrained(real_dir, dtype="float32", max_batch_size=16)
