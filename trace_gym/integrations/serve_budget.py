"""One server-wide budget of live units: each open session and each snapshot handle is one unit, since either
can keep an env's OS resources alive (a sandboxed env's session holds a lineage, and each native snapshot a
frozen fork of it). The budget is derived from this host when the server starts: the largest count whose total
footprint (the env's ``host_footprint``, `trace_gym.limits`) passes every OS limit `check_host` checks and takes
at most ``share`` of the memory available (`trace_gym.limits.available_memory`).
"""

from __future__ import annotations

import contextlib
import math
import resource
import threading
from dataclasses import dataclass

from trace_gym.env import TextEnv
from trace_gym.errors import UserError
from trace_gym.limits import Footprint, HostNeeds, available_memory, check_host

__all__ = ["PLAIN_UNIT", "BudgetFull", "LiveBudget", "host_budget", "unit_footprint"]

PLAIN_UNIT = Footprint(processes=0.0, descriptors=0.0, namespaces=0.0, memory_bytes=1 << 20)
"""A unit of an env that declares no footprint: its snapshot is a deep copy of the episode (the chat and the
env's fields), counted as 1 MiB."""

_MOST = 1 << 20  # a bound for the search; no host here fits a million sandboxed units


class BudgetFull(UserError):
    """The server holds as many live sessions and snapshots as its budget allows."""


def unit_footprint(env_class: type) -> Footprint:
    """What one live unit of ``env_class`` costs: its branching footprint (a session with snapshots), else
    `PLAIN_UNIT`."""
    footprint = env_class.host_footprint(True) if issubclass(env_class, TextEnv) else None
    return footprint if footprint is not None else PLAIN_UNIT


def _raise_descriptor_limit() -> None:
    """A server's descriptors are its connections and its envs': take the soft limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
        with contextlib.suppress(ValueError, OSError):  # else the soft limit stays; the budget follows it
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def host_budget(footprint: Footprint, connections: int, share: float = 0.5) -> int:
    """The most live units this host holds: every limit of `check_host` passes with ``connections`` descriptors
    besides the units', and the units' memory is at most ``share`` of what is available."""
    _raise_descriptor_limit()

    def fits(n: int) -> bool:
        needs = HostNeeds.of(n, footprint)
        return not check_host(HostNeeds(needs.processes, needs.descriptors + connections, needs.namespaces, 0))

    low, high = 0, _MOST
    while low < high:  # the largest n that fits (check_host is monotone in n)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    room = available_memory()
    if room is not None and footprint.memory_bytes > 0:
        low = min(low, math.floor(share * room / footprint.memory_bytes))
    return low


@dataclass
class LiveBudget:
    """A count of live units against a fixed ``limit``; `take` refuses past it with the fix."""

    limit: int
    used: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def take(self, what: str) -> None:
        with self._lock:
            if self.used >= self.limit:
                raise BudgetFull(f"expected at most {self.limit} live sessions and snapshot handles on this server "
                                 f"(its budget for this host), got one more {what}; fix: release the snapshots and "
                                 "close the sessions you are done with, or retry later")
            self.used += 1

    def give(self, count: int = 1) -> None:
        with self._lock:
            self.used = max(0, self.used - count)
