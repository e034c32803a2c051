"""Shared fixtures: one nano model directory per test session (built from config, nothing downloaded)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


@pytest.fixture(scope="session")
def nano_policy(nano_dir):
    from trace_gym.agents.hf import HFPolicy

    return HFPolicy.from_pretrained(nano_dir)
