"""Ending lineages in the background: close() and reset() return once the kill is sent, and no process of the
ended lineages remains once the reaper has waited for them."""

from __future__ import annotations

import pytest

from tests.environments.sandbox.leaks import settled_at
from trace_gym.environments.sandbox import reaper
from trace_gym.environments.sandbox.host import PythonSandbox, sandbox_processes, start_template
from trace_gym.processes import state


@pytest.mark.parametrize("isolation", ["jail", "none"])
def test_closed_and_reset_episodes_leave_no_process(isolation):
    start_template(isolation=isolation)
    assert sandbox_processes() == []
    boxes = [PythonSandbox(isolation=isolation) for _ in range(6)]
    snapshots = []
    for i, box in enumerate(boxes):
        box.run("import subprocess, time\nx = 1")
        if i % 2:  # a daemon the cell leaves behind (the sweep after the cell kills it; the lineage's end would)
            box.run("import os\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(60)")
        snapshots += [box.snapshot(native=True), box.snapshot(native=True)]
    if isolation == "jail":  # without a user namespace, RLIMIT_NPROC counts every process of the user
        assert len(sandbox_processes()) >= 6 * 4  # supervisor, worker and two frozen forks each
    for snap in snapshots:
        snap.release()
    for i, box in enumerate(boxes):
        (box.reset if i % 2 else box.close)()
    assert reaper.wait(10.0)
    assert sandbox_processes() == []


def test_a_released_snapshot_is_swept_by_the_next_cell():
    start_template()
    with PythonSandbox(prefork=False) as box:  # an exact count: no cell process forked ahead
        box.run("x = 1")
        kept, released = box.snapshot(native=True), box.snapshot(native=True)
        assert len(settled_at(4)) == 4  # supervisor, worker, two frozen forks (the first worker exits by itself)
        frozen = released._frozen.pid
        released.release()  # its channel closes; the sweep after the next cell makes sure it is gone
        assert box.run("x += 1").ok
        assert state(frozen) in ("Z", "X", None)  # killed: a zombie until pid 1 reaps it, or gone
        assert state(kept._frozen.pid) not in ("Z", "X", None)
        restored = PythonSandbox()
        restored.restore(released)  # a released snapshot still restores, by re-running its cells
        assert restored.run("print(x)").output.strip() == "1"
        restored.close()
        kept.release()
    assert sandbox_processes() == []


def test_process_counts_wait_for_lineages_being_reaped():
    start_template()
    box = PythonSandbox()
    box.run("x = 1")
    box.close()  # returns with the kill sent; the count waits until the lineage is gone
    assert sandbox_processes() == []
