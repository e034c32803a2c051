"""No memory crosses a snapshot or an uncommitted cell: every way to make a shared mapping is refused.

A fork copies a private mapping and shares a shared one: a shared mapping in the worker would be the same pages
in every cell, the process forked ahead and every frozen snapshot, so a later cell, a crashed one or a timed-out
one could rewrite what a snapshot holds. Each route is tried from the attacker's side (ctypes and raw flags
included); the "namespaces" level, which has no seccomp filter, shows what the filter alone stops.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.environments.sandbox.leaks import settled
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=5, memory_bytes=1 << 30, processes=32)
HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
LIBC = ("import ctypes, mmap, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.mmap.restype = ctypes.c_void_p\n"
        "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, "
        "ctypes.c_long]\nlibc.mremap.restype = ctypes.c_void_p\n"
        "libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "def check(p):\n    if p in (None, ctypes.c_void_p(-1).value) or p == -1:\n"
        "        raise OSError(ctypes.get_errno(), 'refused')\n")
FILE = "fd = os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o600)\nos.ftruncate(fd, 4096)\n"
ROUTES = {  # each makes a shared mapping (or a SysV segment) or raises OSError
    "anonymous mmap.mmap(-1, n)": "m = mmap.mmap(-1, 4096)",
    "raw MAP_SHARED | MAP_ANONYMOUS": "check(libc.mmap(None, 4096, 3, 0x21, -1, 0))",
    "raw MAP_SHARED_VALIDATE | MAP_ANONYMOUS": "check(libc.mmap(None, 4096, 3, 0x23, -1, 0))",
    "a file in /dev/shm": FILE.format(path="/dev/shm/x") + "m = mmap.mmap(fd, 4096)",
    "a file in /tmp": FILE.format(path="/tmp/x") + "m = mmap.mmap(fd, 4096)",
    "a file in the working directory": FILE.format(path="x") + "m = mmap.mmap(fd, 4096)",
    "a read-only shared file mapping": FILE.format(path="y") + "m = mmap.mmap(fd, 4096, access=mmap.ACCESS_READ)",
    "shm_open": "from multiprocessing import shared_memory\nm = shared_memory.SharedMemory(create=True, size=4096)",
    "memfd": "fd = os.memfd_create('x')\nos.ftruncate(fd, 4096)\nm = mmap.mmap(fd, 4096)",
    "SysV shmget": "check(libc.shmget(0, 4096, 0o1600))",
    "SysV shmat": "check(libc.shmat(0, None, 0))",
    # a shared mapping the worker holds from before the filter (glibc's read-only gconv cache), duplicated
    "mremap of a shared mapping": "start = next(int(line.split('-')[0], 16) for line in open('/proc/self/maps') "
                                  "if line.split()[1][3] == 's')\ncheck(libc.mremap(start, 0, 4096, 1))",
}
WITHOUT_FILTER = ("anonymous mmap.mmap(-1, n)", "raw MAP_SHARED | MAP_ANONYMOUS", "a file in /dev/shm",
                  "a file in the working directory", "shm_open", "SysV shmget", "mremap of a shared mapping")


@pytest.fixture(scope="module", autouse=True)
def templates() -> None:
    start_template()
    start_template(isolation="namespaces")


def attempts(isolation: str) -> dict[str, str]:
    """Each route in its own cell: "made", or "refused <errno>"."""
    found = {}
    with PythonSandbox(LIMITS, isolation=isolation) as box:
        box.run("keep = 'still here'")
        for name, body in ROUTES.items():
            code = HOOK_OFF + LIBC + "try:\n" + "".join(f"    {line}\n" for line in body.splitlines())
            out = box.run(code + "    print('made')\nexcept OSError as e:\n    print('refused', e.errno)")
            found[name] = out.output.strip()
        assert box.run("keep").output == "'still here'\n"  # the model got exceptions; the sandbox carries on
    assert settled() == []
    return found


def test_every_route_to_a_shared_mapping_is_refused_with_an_error_in_the_cell() -> None:
    assert attempts("jail") == {name: "refused 1" for name in ROUTES}  # EPERM from the filter


def test_without_the_filter_the_same_routes_make_shared_mappings() -> None:
    found = attempts("namespaces")
    assert {name: found[name] for name in WITHOUT_FILTER} == {name: "made" for name in WITHOUT_FILTER}


@pytest.fixture
def written() -> Iterator[tuple[PythonSandbox, PythonSandbox]]:
    """A mapping that held SNAP0 when a snapshot was taken, then written by a later cell (LATER), a crashed cell
    (CRASH) and a timed-out one (TIMEO): (the live sandbox, one restored from the snapshot)."""
    box, restored = PythonSandbox(LIMITS), PythonSandbox(LIMITS)
    made = box.run("import mmap\nm = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE)\nm[:5] = b'SNAP0'")
    assert made.committed, made.output
    snap = box.snapshot()
    assert snap.kind == "native"
    assert box.run("m[:5] = b'LATER'").committed
    assert box.run("m[:5] = b'CRASH'\nimport os\nos._exit(1)").status == "crashed"
    assert box.run("m[:5] = b'TIMEO'\nwhile True:\n    pass").status == "timeout"
    restored.restore(snap)
    yield box, restored
    box.close()
    restored.close()
    snap.release()
    assert settled() == []


def test_a_snapshot_keeps_its_bytes_after_later_and_uncommitted_writes(written) -> None:
    box, restored = written
    assert restored.run("bytes(m[:5])").output == "b'SNAP0'\n"
    assert box.run("bytes(m[:5])").output == "b'LATER'\n"  # the crashed and the timed-out cells left nothing


def test_without_the_filter_a_shared_mapping_crosses_snapshots_and_uncommitted_cells() -> None:
    # What the filter stops, at the level that has none: the pages of mmap.mmap(-1, n) are the snapshot's too.
    box, restored = PythonSandbox(LIMITS, isolation="namespaces"), PythonSandbox(LIMITS, isolation="namespaces")
    box.run("import mmap\nm = mmap.mmap(-1, 4096)\nm[:5] = b'SNAP0'")
    snap = box.snapshot()
    assert box.run("m[:5] = b'CRASH'\nimport os\nos._exit(1)").status == "crashed"
    restored.restore(snap)
    assert restored.run("bytes(m[:5])").output == "b'CRASH'\n"
    box.close()
    restored.close()
    snap.release()
    assert settled() == []
