"""The longest sandbox steps a model can cause, with the default limits, against their bounds (docs/sandbox.md):
a restore whose frozen fork stalls, followed by a re-run that fills replay_s and a cell that runs to its
timeout; a cell whose worker dies (the rebuild is deferred); a cell whose reply comes late; a snapshot() the
worker stalls. Also what one episode can write before its quota stops it. About two minutes.

    python benchmarks/sandbox_worst_step.py
"""

from __future__ import annotations

import os
import time

from _common import machine, write_json

from trace_gym.environments.sandbox import host
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
RUNTIME = HOOK_OFF + "import time\nrt = sys.modules['__main__']\nw = sys.modules['wire']\n"
STALL_RESTORES = RUNTIME + ("_copy, calls = rt._copy_into, []\ndef copy(a, b):\n    calls.append(1)\n"
                            "    return _copy(a, b) if len(calls) == 1 else time.sleep(3600)\nrt._copy_into = copy")
LATE_REPLY = RUNTIME + ("_send = w.send\ndef send(sock, obj, fds=None, **k):\n    if obj.get('committed'):\n"
                        "        time.sleep(3600)\n    return _send(sock, obj, fds, **k)\nw.send = send")


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    limits = SandboxLimits()
    start_template()
    rows = []

    # 1. restore (stalls) -> replay in a new lineage (fills replay_s) -> a cell to its timeout
    box = PythonSandbox(limits)
    for _ in range(3):  # 27 s of state: more than replay_s=20 can re-run
        box.run("import time\ntime.sleep(9)")
    box.run(STALL_RESTORES)
    snap = box.snapshot()
    branch = PythonSandbox(limits)
    branch.restore(snap)
    seconds, result = _timed(lambda: branch.run("import time\ntime.sleep(3600)"))
    bound = (host._SPAWN_S + host._LINEAGE_START_S + limits.replay_s + limits.timeout_s + 2 * host._EXEC_GRACE_S
             + 3 * host._CONTROL_S)
    rows.append(("restore stalls + re-run + cell to its timeout", seconds, bound, result.status))
    branch.close()
    snap.release()
    box.close()

    # 2. the worker dies: the step reports it, the next cell rebuilds
    box = PythonSandbox(limits)
    for _ in range(3):
        box.run("import time\ntime.sleep(5)")
    seconds, result = _timed(lambda: box.run(HOOK_OFF + "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"))
    overrun = limits.timeout_s + host._EXEC_GRACE_S + host._CONTROL_S  # the cell, then the sweep of what overran
    rows.append(("the worker dies (rebuild deferred)", seconds, overrun, result.status))
    seconds, result = _timed(lambda: box.run("1"))
    rows.append(("the next cell: rebuild by re-running 15 s of cells", seconds,
                 host._LINEAGE_START_S + limits.replay_s + limits.timeout_s + 2 * host._EXEC_GRACE_S + host._CONTROL_S,
                 result.status))
    box.close()

    # 3. a reply held back by the worker the cell became
    box = PythonSandbox(limits)
    seconds, result = _timed(lambda: box.run(LATE_REPLY))
    rows.append(("a cell whose reply never comes", seconds, overrun, result.status))
    box.close()

    # 4. snapshot() of a worker that stalls it
    box = PythonSandbox(limits)
    box.run(RUNTIME + "rt._Runtime._snapshot = lambda self, h, c, d: time.sleep(3600)")
    seconds, snap = _timed(lambda: box.snapshot())
    rows.append(("snapshot() the worker stalls", seconds, host._SNAPSHOT_S + host._CONTROL_S, snap.kind))
    box.close()

    # 5. disk: what one episode can write before the quota stops it
    box = PythonSandbox(limits)
    wrote = int(box.run("import os\ntotal = 0\nfor where in ('.', '/tmp', '/dev/shm'):\n    for i in range(1000):\n"
                        "        try:\n            with open(os.path.join(where, f'f{i}'), 'wb') as f:\n"
                        "                f.write(b'x' * (1 << 20))\n            total += 1 << 20\n"
                        "        except OSError:\n            break\nprint(total)").output)
    box.close()

    print(f"{'step':<52}{'measured s':>12}{'bound s':>10}  outcome")
    for name, seconds, bound, outcome in rows:
        print(f"{name:<52}{seconds:>12.1f}{bound:>10.1f}  {outcome}")
    print(f"\none episode wrote {wrote / (1 << 20):.0f} MiB before its quota (disk_bytes = "
          f"{limits.disk_bytes / (1 << 20):.0f} MiB, a tmpfs: memory, not host disk)")
    print(f"load average {os.getloadavg()[0]:.1f} on {machine()['cpus']} cores")
    result = {"steps": [{"step": n, "measured_s": s, "bound_s": b, "outcome": o} for n, s, b, o in rows],
              "episode_disk_bytes": wrote, "load_average": os.getloadavg(), "machine": machine()}
    print(f"wrote {write_json('sandbox_worst_step', result)}")


if __name__ == "__main__":
    main()
