"""Control groups per lineage, where this host process may make them: one for memory and one for CPU.

- **Memory**: a hard limit on everything the lineage holds (every process's pages, its tmpfs, pipe and socket
  buffers), without swap beyond it.
- **CPU**: an equal share. Each lineage's group has the default weight, so a lineage that runs 60 busy processes
  weighs what one busy process of the host weighs, and its neighbours keep their share of the cores.

Each controller comes from a cgroup v1 hierarchy of it that this process can write (root, usually), or a cgroup
v2 folder whose children get it (``cgroup.subtree_control``); elsewhere there is none, and docs/sandbox.md
says what bounds a lineage then. Groups are named for the host process (pid and start time): groups left by a
host that was killed are removed when the next one makes its own. Host side only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time

from trace_gym.processes import start_time

CONTROLLERS = ("memory", "cpu")
_V1_PROBE = {"memory": "memory.limit_in_bytes", "cpu": "cpu.shares"}
_PREFIX = "trace-sandbox-"


@functools.cache
def _parent(controller: str) -> tuple[str, str] | None:
    """("v1" | "v2", the folder our groups go in) for ``controller``, or None when this process cannot make
    groups of it."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            for mount in {f"/sys/fs/cgroup/{controllers}", f"/sys/fs/cgroup/{controller}"}:
                folder = mount + path
                if os.path.isfile(os.path.join(folder, _V1_PROBE[controller])) and os.access(folder, os.W_OK):
                    return "v1", folder
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                folder = mount + path
                try:
                    with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                        delegated = controller in f.read().split()
                except OSError:
                    continue
                if delegated and os.access(folder, os.W_OK):
                    return "v2", folder
    return None


def available(controller: str = "memory") -> bool:
    return _parent(controller) is not None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _remove_stale(folder: str) -> None:
    """Remove the (empty) groups of hosts that are gone; a group still in use by a live host is left alone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            owner = name[len(_PREFIX):].split("-", 1)[0].split(".")
            if name.startswith(_PREFIX) and len(owner) == 2 and owner[0].isdigit() \
                    and start_time(int(owner[0])) != owner[1]:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(folder, name))


class LineageGroups:
    """One lineage's groups: memory with a hard limit of ``memory_limit`` bytes, CPU at the default weight.

    Made for each controller this process can make groups of; ``OSError`` if one of those cannot be made (the
    caller then does not start the lineage)."""

    def __init__(self, name: str, memory_limit: int):
        self.paths: list[str] = []
        stem = f"{_PREFIX}{os.getpid()}.{start_time(os.getpid())}-{name}"
        try:
            for controller in CONTROLLERS:
                found = _parent(controller)
                if found is None:
                    continue
                version, parent = found
                path = os.path.join(parent, stem)
                if path not in self.paths:  # cgroup v2: one folder for both controllers
                    _remove_stale(parent)  # in each hierarchy (v1 keeps memory and CPU apart)
                    os.mkdir(path)
                    self.paths.append(path)
                self._configure(controller, version, path, memory_limit)
        except OSError:
            self.remove()
            raise

    @staticmethod
    def _configure(controller: str, version: str, path: str, memory_limit: int) -> None:
        if controller == "memory" and version == "v1":
            _write(os.path.join(path, "memory.limit_in_bytes"), str(memory_limit))
            with contextlib.suppress(OSError):  # present only with swap accounting
                _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory_limit))
        elif controller == "memory":
            _write(os.path.join(path, "memory.max"), str(memory_limit))
            with contextlib.suppress(OSError):
                _write(os.path.join(path, "memory.swap.max"), "0")
        elif version == "v1":
            _write(os.path.join(path, "cpu.shares"), "1024")  # the weight of one process of the parent group
        else:
            _write(os.path.join(path, "cpu.weight"), "100")

    def add(self, pid: int) -> None:
        """Move ``pid`` in; its future children are born in the groups."""
        for path in self.paths:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def procs(self) -> set[int] | None:
        """The pids in the groups, in this process's view: the kernel's list of the lineage's processes (a process
        cannot leave them: the jail has no cgroup file system). None if it cannot be read."""
        if not self.paths:
            return None
        try:  # os.read: this is read before and after every cell, and a text file object costs three times more
            fd = os.open(os.path.join(self.paths[0], "cgroup.procs"), os.O_RDONLY)
            try:
                data = b""
                while chunk := os.read(fd, 1 << 16):  # to the end: the kernel hands a list over a page at a time
                    data += chunk
            finally:
                os.close(fd)
            return {int(pid) for pid in data.split()}
        except (OSError, ValueError):
            return None

    def remove(self) -> bool:
        """Remove the (emptied) groups; the kernel may take a moment to let the last killed process go."""
        for _ in range(100):
            left = []
            for path in self.paths:
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(path)
            self.paths = left
            if not left:
                return True
            time.sleep(0.01)
        return False
