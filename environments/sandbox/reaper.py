"""Ending lineages off the caller's thread: ``close()`` and ``reset()`` cost a signal, not the kernel's teardown.

Killing a lineage's pid 1 makes the kernel kill every process of its PID namespace, but the supervisor exits
only once all of them have (each unmaps a forked copy of an interpreter with numpy and sympy loaded), which took
~44 ms per episode at 256 episodes held. The host sends the signal and hands the supervisor's pidfd to this
module's one thread, which waits on all of them at once (``poll``), then closes each pidfd and runs its cleanup.
Nothing is left unkilled meanwhile: the signal is sent before ``close()`` returns (or, without namespaces, when
the grace period of a supervisor that sweeps and exits by itself runs out). ``wait`` blocks until every lineage
handed over is gone; ``trace_gym.processes`` calls it before it counts processes, so leak checks see what
outlives ``close()``.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable

from trace_gym.processes import register_reaper


class _Reaper:
    """One thread per host process, waiting on the pidfds of killed (or exiting) supervisors."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.cond = threading.Condition()
        self.pending: dict[int, tuple[float, Callable[[], None] | None]] = {}  # pidfd -> (kill at, cleanup)
        self.cleaning = 0  # cleanups under way (their pidfd already out of pending)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        threading.Thread(target=self._loop, name="trace-sandbox-reaper", daemon=True).start()

    def add(self, pidfd: int, kill_at: float = -math.inf, cleanup: Callable[[], None] | None = None) -> None:
        """Own ``pidfd`` from now on: SIGKILL it at ``kill_at`` (monotonic; now by default) unless it has exited,
        then close it and run ``cleanup``."""
        if kill_at <= time.monotonic():
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            kill_at = math.inf
        with self.cond:
            self.pending[pidfd] = (kill_at, cleanup)
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def wait(self, timeout: float) -> bool:
        """True once every lineage handed over so far is gone (False after ``timeout`` seconds)."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.pending and not self.cleaning, timeout)

    def _loop(self) -> None:
        while True:
            with self.cond:
                pending = dict(self.pending)
            poller = select.poll()
            poller.register(self.wake_r, select.POLLIN)
            for fd in pending:
                poller.register(fd, select.POLLIN)
            first = min((at for at, _ in pending.values()), default=math.inf)
            left = first - time.monotonic()
            ready = {fd for fd, _ in poller.poll(None if left == math.inf else max(0, math.ceil(left * 1000)))}
            if self.wake_r in ready:
                with contextlib.suppress(OSError):
                    while os.read(self.wake_r, 4096):
                        pass
            now = time.monotonic()
            for fd, (at, cleanup) in pending.items():
                if fd in ready:
                    self._done(fd, cleanup)
                elif at <= now:  # a supervisor that did not exit by itself within its grace period
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    with self.cond:
                        self.pending[fd] = (math.inf, cleanup)

    def _done(self, fd: int, cleanup: Callable[[], None] | None) -> None:
        with self.cond:  # closed under the lock: `add` cannot meet the number again before it is out of pending
            self.pending.pop(fd, None)
            self.cleaning += 1
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            if cleanup is not None:
                with contextlib.suppress(OSError):
                    cleanup()
        finally:
            with self.cond:
                self.cleaning -= 1
                self.cond.notify_all()


_instance: _Reaper | None = None
_lock = threading.Lock()


def reaper() -> _Reaper:
    """This host process's reaper (a forked host starts its own; the parent's pending lineages stay its own)."""
    global _instance
    with _lock:
        if _instance is None or _instance.owner != os.getpid():
            _instance = _Reaper()
        return _instance


def wait(timeout: float = 10.0) -> bool:
    """Until every lineage this process has ended is gone (True), or ``timeout`` seconds (False)."""
    with _lock:
        current = _instance if _instance is not None and _instance.owner == os.getpid() else None
    return True if current is None else current.wait(timeout)


register_reaper(wait)
