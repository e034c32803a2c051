"""The cell process an idle worker forks ahead of the cell: a cell runs in it, nothing else does, and it goes
with the worker."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.environments.sandbox.leaks import settled
from trace_gym import processes
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

LIMITS = SandboxLimits(timeout_s=10)


def children(pid: int) -> list[int]:
    """Live (non-zombie) children of ``pid``."""
    return processes.children(pid, live=True)


def standby_of(box: PythonSandbox, wait_s: float = 10.0) -> int:
    """The one child the idle worker forked for the next cell (waits for the fork: it is asked, not awaited)."""
    assert box.pid is not None
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        kids = children(box.pid)
        if len(kids) == 1:
            return kids[0]
        time.sleep(0.01)
    raise AssertionError(f"expected the idle worker {box.pid} to have forked one cell process, got {children(box.pid)}")


@pytest.fixture(autouse=True)
def no_leak():
    start_template()
    yield
    assert settled() == []


def test_the_next_cell_runs_in_the_process_forked_before_it():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 1")
        ahead = standby_of(box)
        result = box.run("x += 1\nx")
        assert result.output == "2\n" and result.committed
        assert box.pid == ahead  # the kernel's word for the committing process: the one forked ahead
        assert standby_of(box) != ahead  # and the new worker forks the next one


def test_a_restored_worker_forks_its_first_cell_process_before_the_cell():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 41")
        snap = box.snapshot()
        restored = PythonSandbox(LIMITS)
        restored.restore(snap)
        restored._start()
        ahead = standby_of(restored)
        assert restored.run("x + 1").output == "42\n" and restored.pid == ahead
        restored.close()
        snap.release()


def test_without_prefork_a_worker_forks_at_the_cell():
    with PythonSandbox(LIMITS, prefork=False) as box:
        box.run("x = 1")
        time.sleep(0.2)
        assert box.pid is not None and children(box.pid) == []
        assert box.run("x += 1\nx").output == "2\n"


def test_no_cell_process_is_forked_when_no_cell_follows():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 1", more=False)
        time.sleep(0.2)
        assert box.pid is not None and children(box.pid) == []


def test_a_cell_that_crashes_in_the_forked_process_leaves_the_worker_and_its_state():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 1")
        worker = box.pid
        standby_of(box)
        result = box.run("import os\nx = 2\nos._exit(3)")
        assert result.status == "crashed" and not result.committed and "status 3" in result.output
        assert box.pid == worker and box.run("x").output == "1\n"


def test_a_standby_killed_while_idle_is_replaced_by_a_fork_at_the_cell():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 1")
        os.kill(standby_of(box), signal.SIGKILL)
        time.sleep(0.1)
        result = box.run("x += 1\nx")
        assert result.output == "2\n" and result.committed


def test_a_handler_a_cell_installed_never_runs_in_the_worker_between_cells():
    # A signal sent to the idle worker waits (blocked): the handler, model code, runs in no process outside a
    # cell, so the worker and the process forked ahead hold the same state.
    with PythonSandbox(LIMITS) as box:
        box.run("import signal\nhits = []\nsignal.signal(signal.SIGUSR1, lambda *a: hits.append(1))")
        standby_of(box)
        assert box.pid is not None
        os.kill(box.pid, signal.SIGUSR1)
        time.sleep(0.1)
        assert box.run("len(hits)").output == "0\n"


def test_a_cell_still_gets_its_own_signals():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 0")
        out = box.run("import signal, time\nhits = []\nsignal.signal(signal.SIGALRM, lambda *a: hits.append(1))\n"
                      "signal.setitimer(signal.ITIMER_REAL, 0.01)\ntime.sleep(0.5)\nlen(hits)")
        assert out.output == "1\n"


def test_closing_ends_the_process_forked_ahead():
    box = PythonSandbox(LIMITS)
    box.run("x = 1")
    ahead = standby_of(box)
    box.close()
    assert ahead not in settled() and settled() == []


def test_a_daemon_started_in_the_forked_process_goes_with_its_cell():
    with PythonSandbox(LIMITS) as box:
        box.run("x = 1")
        standby_of(box)
        before = sorted(settled(0.0))
        box.run("import sys\nsys.modules['__main__']._Guard.untrusted = False\nimport os, time\n"
                "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n"
                "    os._exit(0)\ntime.sleep(0.2)")
        standby_of(box)  # the new worker's, forked after the sweep
        end = time.monotonic() + 5
        while len(settled(0.0)) != len(before) and time.monotonic() < end:  # the old worker exits by itself
            time.sleep(0.01)
        assert len(settled(0.0)) == len(before)  # supervisor, worker, its forked cell process: no daemon


# --------------------------------------------------------------------------- the sweep's fast path
def _settle(count: int, *boxes: tuple[PythonSandbox, int]) -> None:
    """Wait until this host's episode processes number ``count`` and each box's worker has its number of children
    (the cell process it forks ahead, and frozen forks): an old worker exits by itself, a new one forks after the
    cell."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if len(settled(0.0)) == count and all(b.pid is not None and len(children(b.pid)) == n for b, n in boxes):
            return
        time.sleep(0.05)
    raise AssertionError(f"expected {count} episode processes, got {settled(0.0)}")


@pytest.fixture
def supervisor_requests(monkeypatch) -> list[str]:
    from trace_gym.environments.sandbox import cgroups
    from trace_gym.environments.sandbox.host import _Lineage

    if not cgroups.available():
        pytest.skip("no cgroups on this host: every sweep asks the supervisor")
    ops: list[str] = []
    ask = _Lineage._ask

    def counted(self, msg, *args, **kwargs):
        ops.append(msg.get("op"))
        return ask(self, msg, *args, **kwargs)

    monkeypatch.setattr(_Lineage, "_ask", counted)
    return ops


def test_a_cell_that_left_nothing_costs_no_round_trip_to_the_supervisor(supervisor_requests):
    with PythonSandbox(LIMITS) as box:
        box.run("x = 0")
        for _ in range(3):
            _settle(3, (box, 1))  # supervisor, worker, the cell process forked ahead
            supervisor_requests.clear()
            assert box.run("x += 1").committed
            assert "sweep" not in supervisor_requests  # the kernel's list held only known processes
        _settle(3, (box, 1))
        box.run("import sys\nsys.modules['__main__']._Guard.untrusted = False\nimport os, time\n"
                "if os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\ntime.sleep(0.1)")
        assert "sweep" in supervisor_requests  # something unknown: the supervisor sweeps, and the daemon goes
        _settle(3, (box, 1))


def test_another_branch_s_forked_ahead_process_is_known_to_the_fast_path(supervisor_requests):
    with PythonSandbox(LIMITS) as box:
        box.run("x = 0")
        snap = box.snapshot()
        branch = PythonSandbox(LIMITS)
        branch.restore(snap)
        branch.run("x")
        _settle(6, (box, 2), (branch, 1))  # supervisor, the frozen fork (box's child), two workers, two forked ahead
        supervisor_requests.clear()
        assert box.run("x += 1").committed
        assert "sweep" not in supervisor_requests
        branch.close()
        snap.release()
