"""Processes an env starts: who descends from whom, and which helpers live as long as their host process.

Envs with OS resources start process-wide helpers once (the sandbox's template, the bounded-call server) and
register their pids here; everything else they start belongs to an episode and must be gone after ``close()``.
The conformance checker counts a process left behind by an episode as a leak and a registered helper as none.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

_services: dict[int, set[int]] = {}  # owner pid -> helper pids (a forked host starts its own helpers)
_reapers: list[Callable[[float], bool]] = []  # waits for processes already killed and being reaped


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses): the state
    letter first, then the parent, ... (proc(5) numbers them from 3); None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` in this process's view, from /proc (None once it is gone)."""
    fields = stat_fields(pid)
    try:
        return int(fields[1]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def state(pid: int) -> str | None:
    """The state letter of ``pid`` (R, S, Z for a zombie, ...), None once it is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def children(pid: int, live: bool = False) -> list[int]:
    """The children of ``pid`` from /proc, zombies (and dead ones) left out when ``live``."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields and int(fields[1]) == pid and not (live and fields[0] in "ZX"):
            found.append(int(entry.name))
    return found


def descendant_pids(pid: int | None = None) -> set[int]:
    """Descendants of ``pid`` (default: this process), read from /proc. Zombies count: an unreaped child still
    holds a pid and a slot of its user's process limit. Processes an env has already killed and reaps in the
    background (`register_reaper`) are waited for first (10 s at most), so the answer is what outlives close()."""
    for wait in list(_reapers):
        wait(10.0)
    root = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields:
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set[int](), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def register_service(*pids: int) -> None:
    """Mark ``pids`` as helpers that live until this process exits (not an episode's processes)."""
    _services.setdefault(os.getpid(), set()).update(p for p in pids if p > 0)


def register_reaper(wait: Callable[[float], bool]) -> None:
    """Register ``wait(timeout) -> bool``, which returns once every process its env has killed is gone."""
    if wait not in _reapers:
        _reapers.append(wait)


def services() -> set[int]:
    """Pids of this process's registered helpers."""
    return set(_services.get(os.getpid(), set()))


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot): with the pid, a name no later process gets.
    None if there is no such process."""
    fields = stat_fields(pid)
    return fields[19] if fields else None
