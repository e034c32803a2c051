"""Every wait on a sandbox process has a bound, whatever a cell did to the worker it becomes: tried from the
attacker's side with small limits. A call that would hang without its bound runs in a thread the test joins
with a generous timeout (a liveness check, not a timing assert)."""

from __future__ import annotations

import threading

import pytest

from tests.environments.sandbox.leaks import settled
from trace_gym.environments.sandbox import host
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

FAST = SandboxLimits(timeout_s=1.0, cpu_s=5, memory_bytes=1 << 30, processes=32, replay_s=1.0)
HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
# The runtime's own reference to wire: it binds the modules it calls before any cell (rebinding wire.send itself no
# longer reaches it), but its own names stay reachable to a cell.
RUNTIME = "import sys, time\nrt = sys.modules['__main__']\nw = rt.wire\n"
# The snapshot's own copy runs; the copy made by each restore from its frozen fork stalls.
STALL_RESTORES = ("_copy, calls = rt._copy_into, []\ndef copy(a, b):\n    calls.append(1)\n"
                  "    return _copy(a, b) if len(calls) == 1 else time.sleep(3600)\nrt._copy_into = copy\n")


@pytest.fixture(scope="module", autouse=True)
def template() -> None:
    start_template()




def finishes(fn, within: float = 60.0):
    """fn()'s value, asserting that it returned at all (it would block for an hour without its bound)."""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(within)
    assert out, "the call did not return"
    return out[0]


def test_a_worker_that_stops_reading_cannot_block_the_host_send() -> None:
    box = PythonSandbox(FAST)
    box.run("keep = 7")
    # The worker this cell becomes never reads again (the first recv is the cell's own commit).
    box.run(HOOK_OFF + RUNTIME + "_recv, calls = w.recv, []\n"
            "def recv(*a, **k):\n    calls.append(1)\n"
            "    return _recv(*a, **k) if len(calls) == 1 else time.sleep(3600)\n"
            "w.recv = recv")
    big = "x = " + repr("a" * (8 << 20)) + "\n"  # far more than a socket buffer holds
    result = finishes(lambda: box.run(big))
    assert result.status == "crashed" and not result.committed
    # The patch is part of the committed state: the rebuilt worker stops reading again, and again the step ends.
    assert finishes(lambda: box.run("keep")).status == "crashed"
    box.reset()
    assert box.run("print(6*7)").output == "42\n"
    box.close()
    assert settled() == []


def test_a_cell_whose_reply_comes_late_is_not_committed() -> None:
    box = PythonSandbox(FAST)
    box.run("keep = 7")
    # The cell finishes at once but its process, now the worker, holds the host's reply back for 4 s.
    late = HOOK_OFF + RUNTIME + ("_send = w.send\ndef send(sock, obj, fds=None, **k):\n"
                                 "    if obj.get('committed'):\n        time.sleep(4)\n"
                                 "    return _send(sock, obj, fds, **k)\n"
                                 "w.send = send\nz = 1")
    result = finishes(lambda: box.run(late))
    assert result.status == "crashed" and not result.committed and "timeout (1.0 s)" in result.output
    assert box.run("print('z' in dir(), keep)").output == "False 7\n"
    box.close()
    assert settled() == []


def test_a_crash_defers_the_rebuild_and_the_rebuild_is_bounded() -> None:
    box = PythonSandbox(FAST)
    for i in range(4):
        assert box.run(f"import time\ntime.sleep(0.4)\na{i} = {i}").committed
    crash = box.run(HOOK_OFF + "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert crash.status == "crashed" and "at the next cell" in crash.output
    assert box.cells and box.workdir is None  # nothing was re-run in the crashing step
    result = finishes(lambda: box.run("print('a0' in dir(), 'a3' in dir())"))
    # replay_s=1.0 holds two or three 0.4 s cells, not four: the rest are dropped, and the output says so
    assert result.output.startswith("True False\n") and "rebuilt only up to cell" in result.output
    assert 2 <= len(box.cells) <= 4 and box.run("a0").output == "0\n"
    box.close()
    assert settled() == []


def test_a_patched_worker_cannot_stretch_snapshot(monkeypatch) -> None:
    monkeypatch.setattr(host, "_SNAPSHOT_S", 1.5)
    box = PythonSandbox(FAST)
    box.run(HOOK_OFF + RUNTIME + "rt._Runtime._snapshot = lambda self, h, c, d: time.sleep(3600)\nx = 1")
    snap = finishes(lambda: box.snapshot())
    assert snap.kind == "replay"
    assert box.run("x").output == "1\n"  # the overrunning worker was dropped; the cells rebuilt it
    box.close()
    assert settled() == []


def test_a_frozen_snapshot_that_stalls_its_restore_falls_back_to_replay(monkeypatch) -> None:
    monkeypatch.setattr(host, "_SPAWN_S", 1.5)
    box = PythonSandbox(FAST)
    box.run(HOOK_OFF + RUNTIME + STALL_RESTORES + "x = 41")
    snap = box.snapshot()
    assert snap.kind == "native"
    branch = PythonSandbox(FAST)
    branch.restore(snap)
    result = finishes(lambda: branch.run("x + 1"))
    assert result.output.startswith("42\n") and "did not answer" in result.output and not snap.alive
    branch.close()
    box.close()
    assert settled() == []


def test_a_snapshot_between_a_restore_and_its_first_cell_keeps_its_bound(monkeypatch) -> None:
    monkeypatch.setattr(host, "_SNAPSHOT_S", 1.5)
    box = PythonSandbox(FAST)
    box.run(HOOK_OFF + RUNTIME + STALL_RESTORES + "x = 41")
    snap = box.snapshot()
    branch = PythonSandbox(FAST)
    branch.restore(snap)
    # The restore's spawn stalls: snapshot() gives up within its own bound, without a new lineage or a re-run.
    assert finishes(lambda: branch.snapshot()).kind == "replay"
    result = branch.run("x + 1")
    assert result.output.startswith("42\n") and "did not answer" in result.output
    branch.close()
    box.close()
    assert settled() == []


def test_a_cell_that_overruns_its_timeout_is_killed_in_time() -> None:
    box = PythonSandbox(FAST)
    result = finishes(lambda: box.run("import time\ntime.sleep(30)\nz = 1"))
    assert result.status == "timeout" and not result.committed
    assert box.run("print('z' in dir())").output == "False\n"
    box.close()
    assert settled() == []
