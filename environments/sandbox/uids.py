"""A host uid and gid of its own for each lineage, where the host runs as root.

The kernel counts some resources per user of the whole machine, not per namespace: pipe buffer pages
(``fs.pipe-user-pages-soft``: past it every pipe of that user shrinks to one page), epoll watches, locked memory,
and, without a user namespace, processes. With one uid for every lineage, one cell could take a user's whole
share from every other episode. Each lineage runs as its own uid from a reserved range instead (inside its user
namespace it still sees the sandbox user's ids; the template writes the mapping, runtime.py).

The range is ``TRACE_SANDBOX_UIDS`` (``first:count``), by default 65,536 ids from 0x71000000 (1,895,825,408),
above the container ranges that systemd and podman hand out and below 2^31. An id is reserved by binding an
abstract Unix socket named for it in this network namespace: the kernel frees the name when its holder exits,
however it exits, so the trace-gym processes of one machine never hand out the same id twice, and a killed host
leaks none. Host side only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from trace_gym.errors import ConfigError

_DEFAULT = (0x71000000, 65536)
_lock = threading.Lock()
_next = [os.getpid() * 2654435761]  # where this process starts looking (different for each process)


def _range() -> tuple[int, int]:
    text = os.environ.get("TRACE_SANDBOX_UIDS")
    if not text:
        return _DEFAULT
    try:
        first, count = (int(part, 0) for part in text.split(":"))
    except ValueError:
        first = count = -1
    if first < 1 or count < 1 or first + count > 1 << 31:
        raise ConfigError(f"expected TRACE_SANDBOX_UIDS as first:count inside 1..2^31, got {text!r}; fix: unset it "
                          "or name a free range, e.g. 0x71000000:65536")
    return first, count


class LineageIds:
    """A reserved uid (used as the gid too), held until ``release()``."""

    def __init__(self, uid: int, holder: socket.socket):
        self.uid, self.holder = uid, holder

    def release(self, check: bool = False) -> None:
        """Free the uid once the lineage is gone. ``check`` (a lineage without a PID namespace, whose processes
        may outlive its supervisor): a uid that some process still runs as stays reserved until none does."""
        with _lock:
            held = [*_quarantine, self] if check else [self]
            _quarantine.clear()
            running = _running_uids() if check else set()
            for ids in held:
                if ids.uid in running:
                    _quarantine.append(ids)
                else:
                    with contextlib.suppress(OSError):
                        ids.holder.close()


_quarantine: list[LineageIds] = []


def reserve() -> LineageIds:
    """A uid of the range that no other lineage on this machine holds; OSError when all are taken."""
    first, count = _range()
    with _lock:
        for _ in range(count):
            uid = first + _next[0] % count
            _next[0] += 1
            holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                holder.bind(f"\0trace-sandbox-uid-{uid}")
            except OSError:
                holder.close()
                continue
            return LineageIds(uid, holder)
    raise OSError(0, f"every uid of the sandbox's range {first}:{count} is in use; fix: set TRACE_SANDBOX_UIDS to "
                     "a larger free range")


def _running_uids() -> set[int]:
    """The real uids of every process on this machine."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{name}/status") as f:
                found.add(int(next(line for line in f if line.startswith("Uid:")).split()[1]))
    return found
