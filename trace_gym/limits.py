"""Host limits a step of many episodes needs, checked before the first step (docs/scale.md).

An env whose episodes hold OS resources declares what one trajectory costs the host at the step's peak
(the hook ``TextEnv.host_footprint``: processes, descriptors in the trainer, namespaces of each kind, memory); the
sandboxed math envs give the figures `benchmarks/scale.py` measures. `check_host` compares a step's total with
this host's limits and returns one line per shortfall, each with its fix; `ensure_host` first raises this
process's own soft limits up to the hard ones where that is enough, then raises `ConfigError` on what is left
(memory short of the estimate is a warning: the kernel may still fit it).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import warnings
from dataclasses import dataclass
from pathlib import Path

from trace_gym.errors import ConfigError

_NAMESPACES = ("user", "pid", "net", "ipc", "mnt", "uts")  # one of each per sandbox lineage
_MARGIN = 512  # descriptors and processes the trainer needs besides its episodes


@dataclass(frozen=True)
class Footprint:
    """What one trajectory costs the host at a step's peak."""

    processes: float
    """Processes (of any user) alive per trajectory."""
    descriptors: float
    """Descriptors open in the trainer per trajectory."""
    namespaces: float
    """Namespaces of each kind (user, PID, network, IPC, mount, UTS) per trajectory."""
    memory_bytes: float
    """Proportional set size of those processes per trajectory."""


@dataclass(frozen=True)
class HostNeeds:
    """A step's total: ``trajectories`` times a `Footprint`, rounded up."""

    processes: int
    descriptors: int
    namespaces: int
    memory_bytes: int

    @classmethod
    def of(cls, trajectories: int, footprint: Footprint) -> HostNeeds:
        return cls(*(math.ceil(trajectories * v) for v in (footprint.processes, footprint.descriptors,
                                                           footprint.namespaces, footprint.memory_bytes)))


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroups() -> list[tuple[str, str]]:
    """(controllers, path) of each hierarchy this process belongs to (``""`` controllers: cgroup v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    return [(controllers, path.rstrip("/")) for _, controllers, path in (line.split(":", 2) for line in lines)]


def _pids_cgroup() -> tuple[int, int] | None:
    """(pids.max, pids.current) of this process's cgroup when it has a pids limit."""
    for controllers, path in _cgroups():
        base = "/sys/fs/cgroup" + ("" if controllers == "" else "/pids") + path
        if controllers in ("", "pids") and os.path.exists(base + "/pids.max"):
            limit, current = _read_int(base + "/pids.max"), _read_int(base + "/pids.current")
            if limit is not None and current is not None:
                return limit, current
    return None


def _cgroup_memory_room() -> int | None:
    """Memory this process's cgroup still allows (v2 memory.max, else v1 memory.limit_in_bytes), or None."""
    for controllers, path in _cgroups():
        if controllers == "":
            limit, usage = f"/sys/fs/cgroup{path}/memory.max", f"/sys/fs/cgroup{path}/memory.current"
        elif "memory" in controllers.split(","):
            limit, usage = (f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes",
                            f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes")
        else:
            continue
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 1 << 60:  # "max" or a page-rounded 2^63: no limit
            return max(0, cap - used)
    return None


def _running_processes() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


def check_host(needs: HostNeeds) -> list[str]:
    """One line per limit of this host that ``needs`` would pass: what is needed, what there is, the fix."""
    problems = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needs.descriptors + _MARGIN
    if soft != resource.RLIM_INFINITY and soft < want:
        problems.append(f"expected a descriptor limit of at least {want} (ulimit -n), got {soft}; "
                        f"fix: ulimit -n {max(want, 65536)}")
    if os.geteuid() != 0:  # root is not bound by RLIMIT_NPROC; a user's nested namespaces count against it
        soft, _hard = resource.getrlimit(resource.RLIMIT_NPROC)
        want = needs.processes + _running_processes() + _MARGIN
        if soft != resource.RLIM_INFINITY and soft < want:
            problems.append(f"expected a process limit of at least {want} (ulimit -u), got {soft}; "
                            f"fix: ulimit -u {want}")
    pid_max = _read_int("/proc/sys/kernel/pid_max")
    want = needs.processes + _running_processes() + _MARGIN
    if pid_max is not None and pid_max < want:
        problems.append(f"expected kernel.pid_max of at least {want}, got {pid_max}; "
                        f"fix: sysctl -w kernel.pid_max={max(want, 4194304)}")
    cgroup = _pids_cgroup()
    if cgroup is not None and cgroup[0] < needs.processes + cgroup[1] + _MARGIN:
        problems.append(f"expected this cgroup's pids.max to allow {needs.processes + cgroup[1] + _MARGIN} "
                        f"processes, got {cgroup[0]}; fix: raise the container's pids limit (docker run "
                        f"--pids-limit {needs.processes + cgroup[1] + _MARGIN})")
    if needs.namespaces:
        for kind in _NAMESPACES:
            limit = _read_int(f"/proc/sys/user/max_{kind}_namespaces")
            if limit is not None and limit < needs.namespaces + _MARGIN:
                problems.append(f"expected user.max_{kind}_namespaces of at least {needs.namespaces + _MARGIN}, got "
                                f"{limit}; fix: sysctl -w user.max_{kind}_namespaces={needs.namespaces + _MARGIN}")
    return problems


def available_memory() -> int | None:
    """The memory that new work can take without swapping: the kernel's estimate (MemAvailable), or this process's
    cgroup's room when that is less; None when neither can be read."""
    found = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    rooms = [m for m in (found, _cgroup_memory_room()) if m is not None]
    return min(rooms) if rooms else None


def ensure_host(needs: HostNeeds) -> None:
    """Raise this process's soft descriptor and process limits as far as ``needs`` asks (never past the hard
    ones), then raise `ConfigError` listing every limit still short, each with its one-line fix."""
    for which, want in ((resource.RLIMIT_NOFILE, needs.descriptors + _MARGIN),
                        (resource.RLIMIT_NPROC, needs.processes + _running_processes() + _MARGIN)):
        soft, hard = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY and soft < want:
            target = want if hard == resource.RLIM_INFINITY else min(want, hard)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (target, hard))
    problems = check_host(needs)
    if problems:
        raise ConfigError("; ".join(problems) + " (the step's peak is estimated from the env's host_footprint "
                          "and the step's trajectories: fewer roots also fit)")
    available = available_memory()
    if available is not None and available < needs.memory_bytes:
        warnings.warn(f"a step is estimated to need {needs.memory_bytes >> 20} MiB for its episodes' processes, "
                      f"{available >> 20} MiB are available; fix: fewer roots per step (alloc.roots) or more memory",
                      stacklevel=2)
