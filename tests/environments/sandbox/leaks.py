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
