"""One local Ray cluster per test session (2 CPUs, no dashboard, no usage stats, a temporary directory)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    # Before importing ray: 2.60 otherwise reports usage and writes an auth token under the home folder.
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray = pytest.importorskip("ray")
    temp = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(temp), log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()
