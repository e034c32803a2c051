"""The leak check the sandbox tests share: episode processes still alive once killed ones have been reaped."""

from __future__ import annotations

import time

from trace_gym.environments.sandbox.host import sandbox_processes


def settled(wait_s: float = 4.0) -> list[int]:
    """Pids of this host's episode processes after up to ``wait_s`` for killed ones to be reaped."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if not sandbox_processes():
            return []
        time.sleep(0.02)
    return sandbox_processes()


def settled_at(count: int, wait_s: float = 5.0) -> list[int]:
    """Pids of this host's episode processes once they number ``count`` (a worker that handed over to its committed
    cell exits by itself, a moment after the cell's reply), or as they are after ``wait_s``."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        pids = sandbox_processes()
        if len(pids) == count:
            return pids
        time.sleep(0.02)
    return sandbox_processes()


def steady_count(wait_s: float = 1.0) -> int:
    """The number of this host's episode processes once it holds for two looks 20 ms apart (a worker that handed
    over exits by itself, a moment after its cell's reply), or as it is after ``wait_s``."""
    end = time.monotonic() + wait_s
    last = len(sandbox_processes())
    while time.monotonic() < end:
        time.sleep(0.02)
        now = len(sandbox_processes())
        if now == last:
            return now
        last = now
    return last
