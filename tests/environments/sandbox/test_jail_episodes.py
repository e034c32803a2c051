"""Episodes share nothing, and the host touches nothing a cell can write: tried from the attacker's side, with
the audit-hook tripwire switched off inside every cell. Each layer is tried on its own where it can be (the
seccomp filter against ``isolation="namespaces"``, which has the same namespaces without it)."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.environments.sandbox.leaks import settled
from trace_gym.environments.sandbox import cgroups, dirtree, reaper
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, sandbox_processes, start_template

LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=1 << 30, processes=32, max_output_chars=2000)
HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# A chain of directories ``n`` deep, made by descriptor (3,000 deep, its path is longer than PATH_MAX).
DEEP = ("import os\ndef deep(where, n=3000):\n    fd = os.open(where, os.O_RDONLY)\n    for _ in range(n):\n"
        "        os.mkdir('d', dir_fd=fd)\n        nxt = os.open('d', os.O_RDONLY, dir_fd=fd)\n        os.close(fd)\n"
        "        fd = nxt\n    os.close(os.open('leaf', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n    os.close(fd)\n")


@pytest.fixture(scope="module", autouse=True)
def template() -> None:
    start_template()
    start_template(isolation="namespaces")
    start_template(isolation="none")


def _running() -> list[int]:
    """Sandbox processes that are not zombies (a zombie waits for its parent's reap; it runs nothing)."""
    alive = []
    for pid in sandbox_processes():
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] not in "ZX":
            alive.append(pid)
    return alive




def run(box: PythonSandbox, code: str) -> str:
    return box.run(HOOK_OFF + code).output


# --------------------------------------------------------------------------- the host does nothing by path
@pytest.fixture
def victim(tmp_path) -> Iterator[str]:
    path = tmp_path / "victim"
    path.write_text("host file")
    path.chmod(0o600)
    yield str(path)


@pytest.mark.parametrize("isolation", ["jail", "none"])
def test_no_swapped_in_link_makes_the_host_chown_a_host_file(isolation: str, victim: str) -> None:
    # A branch of the same lineage runs while the other branch snapshots and restores: it replaces every new
    # directory of the lineage's folder with a link to a host file the sandbox user may not touch.
    limits = SandboxLimits(timeout_s=8.0, cpu_s=8, processes=1 << 16)  # see the next test on processes
    box = PythonSandbox(limits, isolation=isolation)
    box.run("x = 1")
    root = os.path.dirname(box.workdir)
    swapper, first = PythonSandbox(limits, isolation=isolation), box.snapshot()
    swapper.restore(first)
    swapper.run("y = 2")  # its own worker, in the same lineage
    swap = (f"import os, time\nend = time.time() + 4\nseen = set(os.listdir({root!r}))\nswapped = 0\n"
            "while time.time() < end:\n"
            f"    for name in set(os.listdir({root!r})) - seen:\n        seen.add(name)\n        try:\n"
            f"            os.rename(os.path.join({root!r}, name), os.path.join({root!r}, 'moved-' + name))\n"
            f"            os.symlink({victim!r}, os.path.join({root!r}, name))\n            swapped += 1\n"
            "        except OSError:\n            pass\nprint('swapped', swapped)")
    swapped: list[str] = []
    attack = threading.Thread(target=lambda: swapped.append(run(swapper, swap)))
    attack.start()
    for _ in range(8):
        snap = box.snapshot()
        branch = PythonSandbox(limits, isolation=isolation)
        branch.restore(snap)
        branch.run("x")
        branch.close()
        snap.release()
    attack.join(60)
    assert swapped and swapped[0].startswith("swapped ") and int(swapped[0].split()[1]) > 0, swapped  # it swapped
    if isolation == "none":  # the lineage's folder sits in a root that only the host can write
        st = os.stat(os.path.dirname(root))
        assert st.st_uid == 0 and st.st_mode & 0o022 == 0
    else:  # the lineage's folder is not on the host's file system at all
        assert not os.path.exists(root) and box.host_workdir != box.workdir
    st = os.stat(victim)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600)
    with open(victim) as f:
        assert f.read() == "host file"
    box.close()
    swapper.close()
    first.release()
    assert settled() == []


@pytest.mark.parametrize("isolation", ["jail", "none"])
def test_a_deep_tree_is_removed_by_close_and_reset(isolation: str) -> None:
    # Deeper than Python's recursion limit. Without namespaces the tree is on the host's disk, where each
    # directory costs milliseconds: 1,200 levels there, 3,000 in the jail's tmpfs. (Without namespaces the
    # process limit counts every process of the sandbox user on the machine: set it out of the way.)
    box = PythonSandbox(SandboxLimits(timeout_s=60.0, cpu_s=60, processes=1 << 16), isolation=isolation)
    n = 3000 if isolation == "jail" else 1200
    assert box.run(DEEP + f"deep('.', {n})\nprint('made')").output == "made\n"
    box.run("x = 1")
    snap = box.snapshot()  # too deep to copy: a replay snapshot, and the lineage's folder holds the tree
    seen = box.host_workdir
    assert seen is not None and os.path.isdir(os.path.join(seen, "d"))
    box.reset()
    # reset() returns with the lineage killed; the reaper sees it gone (without namespaces the supervisor has
    # 10 s to sweep and exit, then the removal runs: the wait leaves room for a loaded machine)
    assert reaper.wait(60.0)
    assert not os.path.exists(seen)
    box.run(DEEP + f"deep('.', {n})")
    seen = box.host_workdir
    box.close()
    assert reaper.wait(60.0)
    assert seen is not None and not os.path.exists(seen)
    snap.release()
    assert settled() == []


def test_a_closed_branch_leaves_no_files_while_the_lineage_lives() -> None:
    box = PythonSandbox(LIMITS)
    box.run("open('keep.txt', 'w').write('k')")
    snap = box.snapshot()
    branch = PythonSandbox(LIMITS)
    branch.restore(snap)
    branch.run(DEEP + "deep('.')\nopen('big', 'wb').write(b'x' * (1 << 20))")
    seen = branch.host_workdir
    assert seen is not None and os.path.exists(os.path.join(seen, "big"))
    branch.close()
    assert not os.path.exists(seen)  # removed by the supervisor, inside the lineage
    assert run(box, "print(open('keep.txt').read())") == "k\n"
    box.close()
    snap.release()
    assert settled() == []


def test_removal_follows_no_link(tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("p")
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "link").symlink_to(outside)
    (tree / "a" / "file").write_text("f")
    top = dirtree.open_dir(str(tmp_path))
    try:
        assert dirtree.remove(top, "tree")
    finally:
        os.close(top)
    assert not tree.exists() and (outside / "precious").read_text() == "p"


# --------------------------------------------------------------------------- nothing shared between episodes
def test_each_lineage_has_its_own_ptys() -> None:
    with PythonSandbox(LIMITS) as a, PythonSandbox(LIMITS) as b:
        opened = run(a, "import os\nm, s = os.openpty()\nprint(os.ttyname(s))\nkeep = (m, s)").strip()
        assert opened.startswith("/dev/pts/")
        out = run(b, f"import os\nprint(sorted(os.listdir('/dev/pts')))\ntry:\n    os.open({opened!r}, os.O_RDWR)\n"
                     "    print('opened')\nexcept OSError as e:\n    print('refused', e.errno)")
        assert "opened" not in out and os.path.basename(opened) not in out.splitlines()[0]
    assert settled() == []


LOCKS = ("import fcntl, os\nf = open('/usr/lib/os-release', 'rb')\nfor name, lock in "
         "(('flock', lambda: fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)), "
         "('lockf', lambda: fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)), "
         "('ofd', lambda: fcntl.fcntl(f, 37, bytes(32)))):\n    try:\n        lock()\n        print(name, 'locked')\n"
         "    except OSError as e:\n        print(name, 'refused', e.errno)\nimport time\ntime.sleep(0.5)\n")


def test_a_cell_cannot_lock_a_file_other_episodes_and_the_host_see() -> None:
    def host_can_lock() -> bool:
        with open("/usr/lib/os-release", "rb+" if os.access("/usr/lib/os-release", os.W_OK) else "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                return False

    with PythonSandbox(LIMITS) as box:
        held = []
        cell = threading.Thread(target=lambda: held.append(run(box, LOCKS)))
        cell.start()
        time.sleep(0.3)
        free = host_can_lock()
        cell.join(30)
    assert free and all("refused 1" in line for line in held[0].splitlines()), held


def test_the_lock_refusal_is_the_seccomp_layer() -> None:
    with PythonSandbox(LIMITS, isolation="namespaces") as box:
        out = run(box, LOCKS)
    assert "flock locked" in out  # without the filter the namespaces alone let a shared file be locked


COUNTED = {  # per-user kernel objects, or memory outside the cell's address space and the lineage's tmpfs
    "inotify": "libc.inotify_init1(0)",
    "memfd": "libc.memfd_create(b'm', 0)",
    "shmget": "libc.shmget(0, 1 << 20, 0o1600)",
    "msgget": "libc.msgget(0, 0o1600)",
    "semget": "libc.semget(0, 1, 0o1600)",
    "mq_open": "libc.mq_open(b'/q', 0o100 | 2, 0o600, None)",
}


def _counted(isolation: str) -> dict[str, tuple[int, int]]:
    code = HOOK_OFF + LIBC + "".join(f"r = {call}\nprint('{name}', r, ctypes.get_errno())\n"
                                     for name, call in COUNTED.items())
    with PythonSandbox(LIMITS, isolation=isolation) as box:
        out = box.run(code).output
    return {line.split()[0]: (int(line.split()[1]), int(line.split()[2])) for line in out.strip().splitlines()}


def test_per_user_counters_and_hidden_memory_are_refused() -> None:
    jailed, namespaced = _counted("jail"), _counted("namespaces")
    for name in COUNTED:
        assert jailed[name] == (-1, 1), (name, jailed[name])
    assert namespaced["inotify"][0] >= 0 and namespaced["memfd"][0] >= 0  # what the filter adds
    assert settled() == []


def test_inotify_instances_of_the_sandbox_user_stay_free() -> None:
    # Taking every inotify instance of the sandbox user would starve every other episode and host process
    # that runs as that user.
    with PythonSandbox(LIMITS) as a, PythonSandbox(LIMITS) as b:
        got = run(a, LIBC + "fds = [libc.inotify_init1(0) for _ in range(200)]\nprint(sum(fd >= 0 for fd in fds))")
        assert got == "0\n"
        assert b.run("print(6*7)").output == "42\n"


def test_one_disk_quota_per_lineage_for_every_file_it_writes() -> None:
    limits = SandboxLimits(timeout_s=20.0, cpu_s=20, disk_bytes=8 << 20)
    write = ("import os\ntotal = 0\nfor where in ('.', '/tmp', '/dev/shm'):\n    for i in range(64):\n"
             "        try:\n            with open(os.path.join(where, f'f{i}'), 'wb') as f:\n"
             "                f.write(b'x' * (1 << 20))\n            total += 1 << 20\n"
             "        except OSError:\n            break\nprint(total >> 20)")
    with PythonSandbox(limits) as a, PythonSandbox(limits) as b:
        wrote = int(run(a, write))
        assert 4 <= wrote <= 8  # all three places draw on one 8 MiB quota
        assert int(run(b, write)) >= 4  # another episode's quota is its own
        assert a.run("print(6*7)").output == "42\n"
    assert settled() == []


HOG = ("import os, time\nkids = []\nfor i in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
       "        held = b'x' * (100 << 20)\n        time.sleep(3)\n        os._exit(0)\n    kids.append(pid)\n"
       "print(sum(os.WIFSIGNALED(os.waitpid(pid, 0)[1]) for pid in kids))")


@pytest.mark.skipif(not cgroups.available(), reason="this host process cannot make memory cgroups: memory is "
                                                   "bounded per process only (docs/sandbox.md)")
def test_a_lineage_s_memory_is_bounded_in_total() -> None:
    # Six processes of 100 MiB each, every one under its own address-space limit: together over the lineage's.
    limits = SandboxLimits(timeout_s=20.0, cpu_s=20, lineage_memory_bytes=256 << 20)
    with PythonSandbox(limits) as box, PythonSandbox(LIMITS) as other:
        killed = int(run(box, HOG))
        assert killed >= 3  # at most two 100 MiB processes fit in 256 MiB at once
        assert box.run("print(6*7)").output == "42\n" and other.run("print(6*7)").output == "42\n"
    assert settled() == []


# --------------------------------------------------------------------------- snapshot integrity
def test_restore_gives_the_files_the_snapshot_captured() -> None:
    box = PythonSandbox(LIMITS)
    box.run("open('data.txt', 'w').write('captured')\nx = 1")
    snap = box.snapshot()
    assert snap.kind == "native"
    # A later cell of the same lineage finds the snapshot's copy and rewrites it.
    out = run(box, "import os\nroot = os.path.dirname(os.getcwd())\nfor name in os.listdir(root):\n"
                   "    path = os.path.join(root, name, 'data.txt')\n"
                   "    if name.startswith('s-') and os.path.exists(path):\n        os.chmod(path, 0o600)\n"
                   "        open(path, 'w').write('tampered')\n        print('rewrote', name)")
    assert "rewrote" in out
    branch = PythonSandbox(LIMITS)
    branch.restore(snap)
    result = branch.run("print(open('data.txt').read())")
    assert result.output.startswith("captured\n") and "changed since it was taken" in result.output
    assert branch.run("x").output == "1\n"
    branch.close()
    box.close()
    snap.release()
    assert settled() == []


# A later cell looks for the snapshot's value in every other process's memory and overwrites it there.
TAMPER = r"""
import os
found = []
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) in (1, os.getpid(), os.getppid()):
        continue
    try:
        fd = os.open(f'/proc/{p}/mem', os.O_RDWR)
    except OSError as e:
        found.append(f'{p}:refused:{e.errno}')
        continue
    try:
        for line in open(f'/proc/{p}/maps'):
            span, perms = line.split()[:2]
            lo, hi = (int(v, 16) for v in span.split('-'))
            if 'rw' not in perms or hi - lo > (64 << 20):
                continue
            try:
                data = os.pread(fd, hi - lo, lo)
            except OSError:
                continue
            at = data.find(b'CAPTURED_' + b'MARKER')
            while at >= 0:
                os.pwrite(fd, b'TAMPERED', lo + at)
                found.append(f'{p}:patched')
                at = data.find(b'CAPTURED_' + b'MARKER', at + 1)
    finally:
        os.close(fd)
print(found)
"""
SET_DUMPABLE = LIBC + "print(libc.prctl(4, 1, 0, 0, 0), ctypes.get_errno())"


@pytest.mark.parametrize("isolation", ["jail", "namespaces", pytest.param("none", marks=pytest.mark.skipif(
    os.geteuid() != 0, reason="isolation='none' without root runs cells as the test's own user"))])
def test_no_later_cell_rewrites_a_frozen_snapshot_s_memory(isolation: str) -> None:
    # The layer on its own: workers are not dumpable, so /proc/PID/mem of a frozen fork stays closed to the
    # same user (with or without the filter and the namespaces).
    with PythonSandbox(LIMITS, isolation=isolation) as box:
        box.run("x = 'CAPTURED_' + 'MARKER'")
        snap = box.snapshot()
        assert snap.kind == "native"
        out = run(box, TAMPER)
        assert "patched" not in out and ":refused:" in out  # the frozen fork was there, and closed
        with PythonSandbox(LIMITS, isolation=isolation) as branch:
            branch.restore(snap)
            assert branch.run("x").output == "'CAPTURED_MARKER'\n"
        snap.release()
    assert settled() == []


def test_the_filter_keeps_a_worker_from_making_itself_dumpable_again() -> None:
    # The filter on its own: without it (namespaces) a cell may turn dumpable back on for itself and for the
    # snapshots forked after it; with it the call is refused, and the tampering above stays closed.
    with PythonSandbox(LIMITS, isolation="namespaces") as box:
        assert run(box, SET_DUMPABLE).split() == ["0", "0"]
    with PythonSandbox(LIMITS) as box:
        assert run(box, SET_DUMPABLE).split() == ["-1", str(1)]  # EPERM
        box.run("x = 'CAPTURED_' + 'MARKER'")
        snap = box.snapshot()
        assert "patched" not in run(box, TAMPER)
        with PythonSandbox(LIMITS) as branch:
            branch.restore(snap)
            assert branch.run("x").output == "'CAPTURED_MARKER'\n"
        snap.release()
    assert settled() == []


def test_an_untouched_snapshot_restores_natively() -> None:
    box = PythonSandbox(LIMITS)
    box.run("open('data.txt', 'w').write('captured')\nimport random\nr = random.random()")
    snap = box.snapshot()
    value = box.run("r").output
    for _ in range(2):
        branch = PythonSandbox(LIMITS)
        branch.restore(snap)
        out = branch.run("print(open('data.txt').read())\nr")
        assert out.output == "captured\n" + value  # no note: the frozen fork answered, with its files intact
        branch.close()
    box.close()
    snap.release()
    assert settled() == []
