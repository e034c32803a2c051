"""Helpers that live as long as this process, not as long as the thread that happened to start them.

The kernel sends a parent-death signal (``PR_SET_PDEATHSIG``: bubblewrap's ``--die-with-parent``, the call
server's own) when the *thread* that forked the child exits, not the process. A template or call server started
from a short-lived thread (a request thread of a server, a thread pool made per call) would be killed with it,
and every sandbox of the process with it. So every such start runs on one thread per process that never ends:
its children die with the process, as intended, and with nothing less.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class _Owner:
    """One daemon thread of this process that runs the starts handed to it, one at a time."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="trace-sandbox-owner", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job, done = self.jobs.get()
            try:
                done.set_result(job())
            except BaseException as e:  # handed to the caller, who raises it in its own thread
                done.set_exception(e)

    def run(self, job: Callable[[], T]) -> T:
        if threading.current_thread() is self.thread:
            return job()
        done: Future = Future()
        self.jobs.put((job, done))
        return done.result()


_owner: _Owner | None = None
_lock = threading.Lock()


def on_owner_thread(job: Callable[[], T]) -> T:
    """``job()`` run on this process's long-lived owner thread (a forked process starts its own)."""
    global _owner
    with _lock:
        if _owner is None or _owner.pid != os.getpid():
            _owner = _Owner()
        owner = _owner
    return owner.run(job)


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` forked by the owner thread: a parent-death signal the child sets
    fires when this process ends, not when the calling thread does."""
    return on_owner_thread(lambda: subprocess.Popen(argv, **kwargs))
