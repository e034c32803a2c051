"""No pool the host shares across episodes can be drained by one cell: tried from the attacker's side (the
audit-hook tripwire switched off in every cell), each with a neighbour episode that must still work, and each
layer on its own where it exists without the others.

- native AIO events (``fs.aio-max-nr``, one pool for the host): the seccomp filter refuses ``io_setup``;
- ptys (``kernel.pty.max``, shared by every devpts instance): each lineage's devpts holds at most 8;
- per-user counters (pipe buffer pages, ``fs.pipe-user-pages-soft``; the process count RLIMIT_NPROC reads): each
  lineage runs as its own host uid;
- CPU: each lineage's processes share one cgroup at the default weight, however many there are.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import threading
import time

import pytest

from tests.environments.sandbox.leaks import settled
from trace_gym.environments.sandbox import cgroups
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

LIMITS = SandboxLimits(timeout_s=20.0, cpu_s=20, max_output_chars=2000)
HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
IO_SETUP = {"x86_64": 206, "aarch64": 0}.get(platform.machine(), -1)
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a host uid per lineage needs a host that runs as root")


@pytest.fixture(scope="module", autouse=True)
def template() -> None:
    for isolation in ("jail", "namespaces", "none"):
        start_template(isolation=isolation)


def run(box: PythonSandbox, code: str) -> str:
    return box.run(HOOK_OFF + code).output


# --------------------------------------------------------------------------- native AIO
@pytest.mark.skipif(IO_SETUP < 0, reason="io_setup's number is known here for x86_64 and aarch64 only")
def test_a_cell_cannot_take_the_host_s_aio_events() -> None:
    take = LIBC + f"ctx = ctypes.c_ulong(0)\nprint(libc.syscall({IO_SETUP}, 65536, ctypes.byref(ctx)), " \
                  "ctypes.get_errno())"
    with PythonSandbox(LIMITS) as box:
        assert run(box, take).split() == ["-1", "1"]  # EPERM: the filter
    libc = ctypes.CDLL(None, use_errno=True)
    ctx = ctypes.c_ulong(0)
    assert libc.syscall(IO_SETUP, 1, ctypes.byref(ctx)) == 0  # the host still has its events
    libc.syscall(IO_SETUP + 1, ctx)  # io_destroy


@pytest.mark.skipif(IO_SETUP < 0, reason="io_setup's number is known here for x86_64 and aarch64 only")
def test_the_aio_refusal_is_the_seccomp_layer() -> None:
    one = (LIBC + f"ctx = ctypes.c_ulong(0)\nprint(libc.syscall({IO_SETUP}, 1, ctypes.byref(ctx)), "
           f"ctypes.get_errno())\nlibc.syscall({IO_SETUP + 1}, ctx)")
    with PythonSandbox(LIMITS, isolation="namespaces") as box:
        assert run(box, one).split()[0] == "0"  # without the filter the namespaces let AIO through


# --------------------------------------------------------------------------- ptys
PTYS = ("import os\nheld, err = [], 0\nwhile len(held) < 200:\n    try:\n        held.append(os.openpty())\n"
        "    except OSError as e:\n        err = e.errno\n        break\nprint(len(held), err)")


@pytest.mark.parametrize("isolation", ["jail", "namespaces"])
def test_a_lineage_holds_a_few_ptys_of_the_host_s_pool(isolation: str) -> None:
    # The devpts bound holds with or without the filter. The attacker keeps its ptys in the worker (they
    # outlive the cell), the neighbour opens as many of its own.
    with PythonSandbox(LIMITS, isolation=isolation) as attacker, PythonSandbox(LIMITS, isolation=isolation) as other:
        assert run(attacker, PTYS).split() == ["8", "28"]  # ENOSPC past the lineage's 8 (runtime.py)
        assert run(other, PTYS).split() == ["8", "28"]
        assert attacker.run("print(len(held))").output == "8\n"  # still held
    assert settled() == []


# --------------------------------------------------------------------------- per-user counters
PIPES = ("import fcntl, os\nheld = []\nfor _ in range(110):\n    r, w = os.pipe()\n    try:\n"
         "        fcntl.fcntl(w, 1031, 1 << 20)\n    except OSError:\n        pass\n    held.append((r, w))\n"
         "print(sum(fcntl.fcntl(w, 1032) for r, w in held) >> 12)")  # F_SETPIPE_SZ, F_GETPIPE_SZ; pages held
ONE_PIPE = "import fcntl, os\nr, w = os.pipe()\nprint(fcntl.fcntl(w, 1032))"


def _soft_pages() -> int:
    with open("/proc/sys/fs/pipe-user-pages-soft") as f:
        return int(f.read())


@ROOT_ONLY
@pytest.mark.parametrize("isolation", ["jail", "namespaces", "none"])
def test_a_cell_cannot_take_the_pipe_pages_of_other_episodes(isolation: str) -> None:
    # Past fs.pipe-user-pages-soft every new pipe of that user gets 2 pages instead of 16: with one uid for
    # every lineage, one cell holding big pipes shrank everyone else's. The attacker's pipes stay open in its
    # worker while the neighbour makes one.
    soft = _soft_pages()
    if soft == 0 or soft > 100 * 256:
        pytest.skip(f"fs.pipe-user-pages-soft is {soft}: 110 pipes of 1 MiB cannot pass it")
    with PythonSandbox(LIMITS, isolation=isolation) as attacker, PythonSandbox(LIMITS, isolation=isolation) as other:
        assert int(run(attacker, PIPES)) >= soft  # the attacker reached the per-user bound ...
        assert run(attacker, ONE_PIPE) == "8192\n"  # ... and feels it itself
        assert run(other, ONE_PIPE) == "65536\n"  # its neighbour does not
    assert settled() == []


def _ids(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        lines = {line.split(":")[0]: line.split()[1:] for line in f}
    return int(lines["Uid"][0]), int(lines["Gid"][0])


def _caps(pid: int) -> int:
    """Effective capabilities of ``pid``, as the host's user namespace counts them."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)


@ROOT_ONLY
@pytest.mark.parametrize("isolation", ["jail", "namespaces", "none"])
def test_each_lineage_runs_as_its_own_host_uid(isolation: str) -> None:
    # The layer on its own: the kernel's view of each worker, and of a restore (same lineage, same uid).
    with PythonSandbox(LIMITS, isolation=isolation) as a, PythonSandbox(LIMITS, isolation=isolation) as b:
        a.run("x = 1")
        b.run("x = 2")
        snap = a.snapshot()
        with PythonSandbox(LIMITS, isolation=isolation) as branch:
            branch.restore(snap)
            branch.run("x")
            assert _ids(branch.pid) == _ids(a.pid)
        ua, ub, template = _ids(a.pid)[0], _ids(b.pid)[0], _ids(start_template(isolation=isolation))[0]
        assert len({ua, ub, template, 0}) == 4 and _ids(a.pid) == (ua, ua)
        assert _caps(a.pid) == 0  # no capability in the host's user namespace ...
        assert _caps(start_template(isolation=isolation)) == 1 << 6 | 1 << 7  # ... the template: SETGID, SETUID
        if isolation != "none":  # inside, the sandbox user's ids as before
            assert run(a, "import os\nprint(os.getuid(), os.getgid())") == f"{template} {template}\n"
        snap.release()
    assert settled() == []


HOLD = ("import os, time\nkids = []\nfor _ in range(40):\n    pid = os.fork()\n    if pid == 0:\n"
        "        time.sleep(60)\n        os._exit(0)\n    kids.append(pid)\ntime.sleep(12)\nprint(len(kids))")


@ROOT_ONLY
@pytest.mark.parametrize("isolation", ["jail", "none"])
def test_another_lineage_s_processes_do_not_count_against_this_one(isolation: str) -> None:
    # RLIMIT_NPROC counts a user's processes across the host: with one uid for every lineage, 40 processes
    # held by one episode (or lineages still being torn down) left a neighbour with a limit of 32 no fork, so
    # its native snapshot fell back to replay. The attacker's children stay alive while the neighbour forks.
    small = SandboxLimits(timeout_s=20.0, cpu_s=20, processes=32, max_output_chars=2000)
    many = SandboxLimits(timeout_s=20.0, cpu_s=20, processes=64, max_output_chars=2000)
    with PythonSandbox(many, isolation=isolation) as attacker, PythonSandbox(small, isolation=isolation) as other:
        attacker.run("import threading")  # a worker first, then the cell that forks and keeps its children
        uid = _ids(attacker.pid)[0]
        holding = threading.Thread(target=lambda: run(attacker, HOLD))
        holding.start()
        try:
            deadline = time.monotonic() + 10
            while _processes_of(uid) < 40 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _processes_of(uid) >= 40  # the attacker's uid holds 40 processes ...
            other.run("x = 41")
            snap = other.snapshot()
            assert snap.kind == "native"  # ... and the neighbour still forks its frozen copy
            assert run(other, "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
                              "print(os.waitpid(pid, 0)[1])") == "0\n"
            snap.release()
        finally:
            holding.join(timeout=60)  # the holding cell ends after 12 s, its children with it
    assert settled() == []


def _processes_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                count += os.stat(f"/proc/{entry}").st_uid == uid
    return count


# --------------------------------------------------------------------------- CPU
SPIN = ("import os, time\nopen('go', 'w').close()\nkids = []\nfor _ in range(60):\n    pid = os.fork()\n"
        "    if pid == 0:\n        end = time.time() + 60\n        while time.time() < end and os.path.exists('go'):\n"
        "            for _ in range(10000):\n                pass\n        os._exit(0)\n    kids.append(pid)\n"
        "for pid in kids:\n    os.waitpid(pid, 0)\nprint('spun', len(kids))")
WORK = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\nprint('worked')"


def _cpu_group(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line.split(":", 2)[2].strip() for line in f
                    if "cpu" in line.split(":")[1].split(",") or line.startswith("0::"))


@pytest.mark.skipif(not cgroups.available("cpu"), reason="this host process cannot make CPU cgroups: CPU is "
                                                         "bounded per cell only (docs/sandbox.md)")
def test_a_cell_s_many_processes_do_not_starve_a_neighbour() -> None:
    # 60 busy processes in one cell: without a group per lineage a neighbour's 1 s of CPU would get 2 cores in
    # 61 and need ~30 s of wall time, past its 15 s timeout; with one it gets about a core's share.
    limits = SandboxLimits(timeout_s=15.0, cpu_s=15)
    attacker, other = PythonSandbox(SandboxLimits(timeout_s=90.0, cpu_s=90)), PythonSandbox(limits)
    other.run("x = 1")
    attacker.run("x = 1")
    spun: list[str] = []
    cell = threading.Thread(target=lambda: spun.append(run(attacker, SPIN)))
    cell.start()
    try:
        for _ in range(200):  # until the 60 processes run (the lineage's supervisor sees them)
            groups = [g for g in _lineage_groups(attacker)]
            if len(groups) >= 60:
                break
            time.sleep(0.1)
        assert len(groups) >= 60 and len(set(groups)) == 1  # all of them in one group ...
        assert groups[0] != _cpu_group(other.pid)  # ... not the neighbour's
        result = other.run(WORK)
    finally:
        os.unlink(os.path.join(attacker.host_workdir, "go"))  # the test's own signal to stop (the host never does this)
        cell.join(60)
    assert result.status == "ok" and result.output == "worked\n", result.output
    assert spun and spun[0].startswith("spun 60"), spun
    attacker.close()
    other.close()
    assert settled() == []


def _lineage_groups(box: PythonSandbox) -> list[str]:
    """The CPU group of every process that runs as the lineage's host uid (the attacker's spinners)."""
    uid = _ids(box.pid)[0]
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != box.pid:
            try:
                if _ids(int(name))[0] == uid:
                    found.append(_cpu_group(int(name)))
            except OSError:
                continue
    return found


# --------------------------------------------------------------------------- the lineage's process limit
# Takes every free slot of the lineage's process limit, and each one that frees up, until told to stop.
FILL = ("import os, time\nopen('go', 'w').close()\nkids = []\nwhile os.path.exists('go'):\n    try:\n"
        "        pid = os.fork()\n    except OSError:\n        time.sleep(0.01)\n        continue\n    if pid == 0:\n"
        "        while os.path.exists('go'):\n            time.sleep(0.05)\n        os._exit(0)\n    kids.append(pid)\n"
        "for pid in kids:\n    os.waitpid(pid, 0)\nprint('held', len(kids))")


@ROOT_ONLY
def test_a_branch_holding_the_process_limit_leaves_the_other_branches_intact() -> None:
    # Branches of one lineage share its process limit. While one branch's cell holds all of it, another
    # branch's cell cannot start: it says so, and that branch's worker and state stay (no crash, no rebuild).
    limits = SandboxLimits(timeout_s=30.0, cpu_s=30, processes=12)
    box = PythonSandbox(limits)
    box.run("x = 1")
    snap = box.snapshot()
    branch = PythonSandbox(limits)
    branch.restore(snap)
    assert branch.run("x").output == "1\n"
    held: list[str] = []
    cell = threading.Thread(target=lambda: held.append(run(box, FILL)))
    cell.start()
    try:
        for _ in range(300):
            worker = branch.pid
            refused = branch.run("x + 1")
            if refused.status == "crashed":
                break
            time.sleep(0.1)
        assert refused.status == "crashed" and "could not start" in refused.output, refused.output
        assert branch.pid == worker  # the same worker, not rebuilt
    finally:
        os.unlink(os.path.join(box.host_workdir, "go"))
        cell.join(60)
    assert held and held[0].startswith("held"), held
    assert branch.run("x + 2").output == "3\n" and branch.pid != worker  # a cell ran (and committed) there
    branch.close()
    box.close()
    snap.release()
    assert settled() == []
