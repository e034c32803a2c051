"""The lineages' control groups: groups that a killed host left behind go when the next host makes its own, in
every hierarchy a controller lives in."""

from __future__ import annotations

import os
import subprocess

import pytest

from trace_gym.environments.sandbox import cgroups


def test_groups_left_by_a_dead_host_are_removed_in_each_controller_s_hierarchy():
    parents = {found[1] for c in cgroups.CONTROLLERS if (found := cgroups._parent(c)) is not None}
    if not parents:
        pytest.skip("this process cannot make cgroups here")
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no live host (and the start time in the name is no process's)
    stale = [os.path.join(parent, f"{cgroups._PREFIX}{gone.pid}.1-L-1") for parent in sorted(parents)]
    for path in stale:
        os.mkdir(path)
    groups = cgroups.LineageGroups("L-test", 1 << 30)
    try:
        assert [p for p in stale if os.path.exists(p)] == []
    finally:
        assert groups.remove()
