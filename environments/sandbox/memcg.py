"""A memory cgroup per lineage, where this host process may make one: a cgroup v1 memory hierarchy it can write
(root, usually), or a cgroup v2 folder whose children get the memory controller. Everything a lineage holds is
charged to it: every process's pages, its tmpfs, pipe and socket buffers. Elsewhere there is none, and
docs/sandbox.md says what bounds a lineage's memory then (per process only). Host side only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time


@functools.cache
def _parent() -> tuple[str, str] | None:
    """("v1" | "v2", the folder our groups go in), or None when this process cannot make memory cgroups."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = "/sys/fs/cgroup/memory" + path
            if os.path.isfile(os.path.join(folder, "memory.limit_in_bytes")) and os.access(folder, os.W_OK):
                return "v1", folder
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                folder = mount + path
                try:
                    with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                        delegated = "memory" in f.read().split()
                except OSError:
                    continue
                if delegated and os.access(folder, os.W_OK):
                    return "v2", folder
    return None


def available() -> bool:
    return _parent() is not None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class MemoryGroup:
    """One lineage's memory cgroup with a hard limit of ``limit`` bytes (no swap beyond it)."""

    def __init__(self, name: str, limit: int):
        found = _parent()
        if found is None:
            raise OSError(0, "no memory cgroup can be made here")
        self.version, parent = found
        self.path = os.path.join(parent, name)
        os.mkdir(self.path)
        try:
            if self.version == "v1":
                _write(os.path.join(self.path, "memory.limit_in_bytes"), str(limit))
                with contextlib.suppress(OSError):  # present only with swap accounting
                    _write(os.path.join(self.path, "memory.memsw.limit_in_bytes"), str(limit))
            else:
                _write(os.path.join(self.path, "memory.max"), str(limit))
                with contextlib.suppress(OSError):
                    _write(os.path.join(self.path, "memory.swap.max"), "0")
        except OSError:
            self.remove()
            raise

    def add(self, pid: int) -> None:
        """Move ``pid`` in; its future children are born in the group."""
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def remove(self) -> bool:
        """Remove the (emptied) group; the kernel may take a moment to let the last killed process go."""
        for _ in range(100):
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.01)
        return False
