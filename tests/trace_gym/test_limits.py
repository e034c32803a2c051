"""Host limits checked before the first step: each shortfall named with its fix; soft limits raised in place."""

from __future__ import annotations

import resource

import pytest

from trace_gym.env_specs import spec_class
from trace_gym.errors import ConfigError
from trace_gym.limits import Footprint, HostNeeds, check_host, ensure_host

SANDBOXED = spec_class("trace/Arithmetic-v0").host_footprint(True)  # type: ignore[union-attr]


def test_a_small_step_fits_and_an_impossible_one_names_each_fix():
    assert check_host(HostNeeds.of(8, SANDBOXED)) == []
    problems = check_host(HostNeeds(processes=10**9, descriptors=10**9, namespaces=10**9, memory_bytes=0))
    assert any("ulimit -n" in p for p in problems) and any("kernel.pid_max" in p for p in problems)
    assert any("max_net_namespaces" in p for p in problems)
    assert all("expected" in p and "fix:" in p for p in problems)
    with pytest.raises(ConfigError, match="fix: ulimit -n"):
        ensure_host(HostNeeds(processes=0, descriptors=10**9, namespaces=0, memory_bytes=0))


def test_ensure_host_raises_the_soft_descriptor_limit_up_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("this host's hard descriptor limit is below what the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        ensure_host(HostNeeds(processes=0, descriptors=2048, namespaces=0, memory_bytes=0))
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 2048 + 512
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_env_without_os_resources_declares_no_footprint():
    assert spec_class("trace/HotpotQA-v0").host_footprint(True) is None  # type: ignore[union-attr]
    flat = spec_class("trace/Arithmetic-v0").host_footprint(False)  # type: ignore[union-attr]
    assert isinstance(flat, Footprint) and flat.processes < SANDBOXED.processes
