"""The symbolic answer check, run in the jail that runs the math envs' cells (``sandbox.host``), by a pool of
warmed checkers.

A checker is a sandbox that ran a setup cell (``expressions.py`` and ``symbolic.py`` loaded from their source,
math-verify imported and warmed, the garbage collector's objects frozen) and was snapshotted natively: a frozen
fork in a lineage of its own. Each check restores that snapshot into a new sandbox (a fork of the frozen fork),
runs one cell that calls ``symbolic.run_check`` on the data, and closes the sandbox: every check starts from the
same state, under the jail's namespaces, seccomp filter and unprivileged user, with the cell's limits
(``LIMITS``), and nothing it does outlives it. The cell's output is read as data: one JSON line, validated.

The pool holds ``pool_size()`` checkers (one per core, fewer if memory is short), built on first use (or by
``start_checker``) by long-lived threads of this module, so that no checker's processes depend on the thread
that happened to ask first. A check takes a free checker, waiting at most ``QUEUE_WAIT_S``; checks run in
parallel, one per checker. Waiting checks are served in turn by client (``trace_gym.fairness``: the env server
names each env call's token and session): the client with the fewest checks running goes first, so a client
whose answers keep every checker busy lets another's check have the next free one. A check that gets no
checker in time raises ``CheckerUnavailableError``, an ``InfraError``: the env reports the turn as an
infrastructure failure, never as the answer's 0. The checkers' processes are registered as services
(``trace_gym.processes``).

Who is at fault when a check gives no verdict:
- the checker (the answer never ran, or might not have): its frozen fork is gone, stopped or not answering
  (checked before each use, by pidfd and /proc), the restore fell back (the cell finds no checking function), or
  the sandbox raised. The checker is rebuilt and the check run again; a check never scores 0 for this. More
  than ``REBUILDS`` rebuilds for one check raise ``CheckerUnavailableError`` (the host cannot run checkers).
- the answer: the check spent its CPU budget (``symbolic.CPU_S``: the verdict says so, or the kernel's CPU
  limit killed the cell): 0 at once. Any other end without a verdict (a crash, the wall-clock limit, the
  checker lost during the cell) is run once more on a healthy checker; if it fails again, the answer gets 0:
  at most ``ANSWER_ATTEMPTS`` runs of one answer's check, so no answer buys unbounded retries.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trace_gym.environments.math import symbolic
from trace_gym.environments.sandbox.bounded import Outcome
from trace_gym.environments.sandbox.host import (
    CellResult,
    PythonSandbox,
    SandboxLimits,
    SandboxSnapshot,
    SandboxUnavailableError,
)
from trace_gym.errors import InfraError
from trace_gym.fairness import Client, FairQueue, current_client
from trace_gym.limits import available_memory
from trace_gym.processes import parent_pid, register_service

TIMEOUT_S = 30.0
"""Wall-clock seconds of one check's cell: the infrastructure's bound, for a starved machine. What bounds an
answer is its CPU time (``symbolic.CPU_S``, then the kernel's limit ``LIMITS.cpu_s``), which a loaded machine
does not stretch."""
LIMITS = SandboxLimits(timeout_s=TIMEOUT_S, cpu_s=math.ceil(symbolic.CPU_S) + 1, memory_bytes=3 << 30,
                       max_output_chars=4000, replay_s=0.0)
"""Per check. replay_s=0: a check never re-runs the setup cell (a lost snapshot is rebuilt by the pool)."""
QUEUE_WAIT_S = 60.0
"""Longest wait for a free checker; past it the check raises ``CheckerUnavailableError``."""
ANSWER_ATTEMPTS = 2
REBUILDS = 3
MAX_POOL = 64
CHECKER_BYTES = 384 << 20
"""Memory one checker is sized at: its frozen fork and supervisor (about 55 MB proportional set size, measured)
and room for the heaviest checks the CPU budget allows."""
_SETUP_LIMITS = SandboxLimits(timeout_s=120.0, cpu_s=120, memory_bytes=3 << 30, replay_s=0.0)
_MARK = "answer-check-verdict:"
_UNREADY = "answer-check-unready"
_HERE = Path(__file__).resolve().parent
_METHODS = (None, "math_verify", "sympy")
_VERDICT_KEYS = {"method", "gold", "answer", "out_of_time", "cpu_s", "wall_s"}


class CheckerUnavailableError(InfraError):
    """No answer checker could be had: the host cannot start one, or all stayed busy past ``QUEUE_WAIT_S``."""


def pool_size() -> int:
    """Checkers per process: one per core this process may use, at most as many as memory holds at
    ``CHECKER_BYTES`` each (half of what is available), and at most ``MAX_POOL``."""
    cores = len(os.sched_getaffinity(0))
    memory = available_memory()
    fits = max(1, memory // 2 // CHECKER_BYTES) if memory is not None else cores
    return max(1, min(cores, fits, MAX_POOL))


def _setup_code() -> str:
    sources = {name: (_HERE / f"{name}.py").read_text() for name in ("expressions", "symbolic")}
    return f'''
import json, sys, types
for _name in ("trace_gym", "trace_gym.environments", "trace_gym.environments.math"):
    sys.modules.setdefault(_name, types.ModuleType(_name)).__path__ = []
def _load(_short, _source):
    _module = types.ModuleType("trace_gym.environments.math." + _short)
    sys.modules[_module.__name__] = _module
    setattr(sys.modules["trace_gym.environments.math"], _short, _module)
    exec(compile(_source, _short + ".py", "exec"), _module.__dict__)
    return _module
_load("expressions", {sources["expressions"]!r})
_symbolic = _load("symbolic", {sources["symbolic"]!r})
def _answer_check(_data):
    _symbolic.refuse_code_from_strings()
    print({_MARK!r} + json.dumps(_symbolic.run_check(*json.loads(_data))))
_symbolic.warm_up()
'''


def _check_cell(data: str) -> str:
    # After a restore that fell back to a fresh worker the function is missing: the answer is never read.
    return f"_answer_check({data!r}) if '_answer_check' in globals() else print({_UNREADY!r})"


def _running(pidfd: int, pid: int) -> bool:
    """The process behind ``pidfd`` has not exited and is not stopped (a stopped frozen fork would make a restore
    wait for the sandbox's spawn deadline)."""
    if select.select([pidfd], [], [], 0)[0]:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZXxTt"


class _Checker:
    """One warmed snapshot, its frozen fork and the lineage's supervisor (pidfds held, to tell them alive)."""

    def __init__(self, isolation: str, user: str | None) -> None:
        self.isolation, self.user = isolation, user
        self.snapshot: SandboxSnapshot | None = None
        self.watched: list[tuple[int, int]] = []  # (pid, pidfd): the frozen fork, the supervisor

    def build(self) -> None:
        """Make the warmed snapshot (again); runs on the pool's long-lived threads."""
        self.discard()
        box = PythonSandbox(_SETUP_LIMITS, user=self.user, isolation=self.isolation)
        try:
            result = box.run(_setup_code(), more=False)  # the worker's one child must be the frozen fork
            if not result.ok:
                raise CheckerUnavailableError("expected the jailed answer checker to start, it did not: "
                                              f"{result.output[-800:]}")
            worker = box.pid
            snapshot = box.snapshot(native=True)
            frozen = _children(worker) if worker is not None else []  # the frozen fork: the worker's one child
            supervisor = parent_pid(worker) if worker is not None else None
        finally:
            box.close()
        if not snapshot.alive or len(frozen) != 1 or supervisor is None:
            snapshot.release()
            raise CheckerUnavailableError("expected a native snapshot of the answer checker, got none (the jail "
                                          "refused it); fix: check that the sandbox's own tests pass on this host")
        for pid in (*frozen, supervisor):
            with contextlib.suppress(OSError):
                self.watched.append((pid, os.pidfd_open(pid)))
        register_service(*frozen, supervisor)  # the checker and its lineage live with this process
        self.snapshot = snapshot

    def healthy(self) -> bool:
        return (self.snapshot is not None and self.snapshot.alive and len(self.watched) == 2
                and all(_running(fd, pid) for pid, fd in self.watched))

    @property
    def frozen_pid(self) -> int | None:
        return self.watched[0][0] if self.watched else None

    def run(self, data: str, times: dict[str, float]) -> CellResult:
        """One check in a restore of the snapshot; ``times`` gets the seconds of the restore and cell together
        (``run_s``: the restore is lazy, done by the cell's start) and of the close."""
        assert self.snapshot is not None
        start = time.perf_counter()
        box = PythonSandbox(LIMITS, user=self.user, isolation=self.isolation)
        box.restore(self.snapshot)
        try:
            return box.run(_check_cell(data), more=False)
        finally:
            ran = time.perf_counter()
            box.close()
            times.update(run_s=ran - start, close_s=time.perf_counter() - ran)

    def discard(self) -> None:
        if self.snapshot is not None:
            self.snapshot.release()
        self.snapshot = None
        for _, fd in self.watched:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.watched = []


def _children(pid: int) -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and parent_pid(int(e.name)) == pid]


class _Pool:
    """This process's checkers for one isolation level and user, and the threads that build them."""

    def __init__(self, isolation: str, user: str | None, size: int) -> None:
        self.isolation, self.user, self.size = isolation, user, size
        self.cond = threading.Condition()
        self.checkers: list[_Checker] = []
        self.free: list[_Checker] = []
        self.waiting: FairQueue[_Ticket] = FairQueue()
        self.built = False
        # Threads that start the jail's processes live as long as this process: a jail started by a short-lived
        # thread of the caller would be tied to that thread.
        self.builders = ThreadPoolExecutor(max_workers=size, thread_name_prefix="answer-checker")

    def ensure(self) -> None:
        """Build every checker now (in parallel, on the builders), once."""
        with self.cond:
            if self.built:
                return
            checkers = [_Checker(self.isolation, self.user) for _ in range(self.size)]
            futures = [self.builders.submit(c.build) for c in checkers]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    with contextlib.suppress(BaseException):
                        future.result()
                for checker in checkers:
                    checker.discard()
                raise
            self.checkers, self.free = checkers, list(checkers)
            self.built = True
            self.cond.notify_all()

    def acquire(self, client: Client) -> _Checker:
        """A free checker for ``client``'s check, in the module docstring's turn; `CheckerUnavailableError` after
        ``QUEUE_WAIT_S``."""
        self.ensure()
        deadline = time.monotonic() + QUEUE_WAIT_S
        ticket = _Ticket()
        with self.cond:
            self.waiting.push(client, ticket)
            self._hand_out()
            while ticket.checker is None:
                left = deadline - time.monotonic()
                if left <= 0 and self.waiting.remove(client, ticket):
                    raise CheckerUnavailableError(
                        f"expected a free answer checker within {QUEUE_WAIT_S:g} s, all {self.size} stayed busy; fix: "
                        "fewer threads checking answers in this process, or more cores for a larger pool")
                self.cond.wait(max(left, 0.01))
            return ticket.checker

    def release(self, checker: _Checker, client: Client) -> None:
        with self.cond:
            self.waiting.done(client)
            self.free.append(checker)
            self._hand_out()

    def _hand_out(self) -> None:
        """Free checkers to waiting checks, in turn (a checker lost while idle is found at its next turn)."""
        handed = False
        while self.free and len(self.waiting):
            _, ticket = self.waiting.pop()
            ticket.checker = self.free.pop(0)
            handed = True
        if handed:
            self.cond.notify_all()

    def rebuild(self, checker: _Checker) -> None:
        self.builders.submit(checker.build).result()


class _Ticket:
    """A check waiting for a checker; ``checker`` is set when one is handed to it."""

    checker: _Checker | None = None


_pools: dict[tuple[int, str, str | None], _Pool] = {}
_pools_lock = threading.Lock()


def _pool(isolation: str, user: str | None, size: int | None = None) -> _Pool:
    with _pools_lock:
        key = (os.getpid(), isolation, user)  # a forked host builds its own
        if key not in _pools:
            _pools[key] = _Pool(isolation, user, size or pool_size())
        return _pools[key]


def start_checker(isolation: str = "jail", user: str | None = "nobody", size: int | None = None) -> None:
    """Build this process's checkers now rather than at the first check (leak checks take their baseline after
    it). ``size``: how many (default ``pool_size()``); only the first call for an isolation level and user sets
    it."""
    _pool(isolation, user, size).ensure()


def checker_pids(isolation: str = "jail", user: str | None = "nobody") -> list[int]:
    """The frozen forks of this process's checkers (for inspection; never used to kill)."""
    pool = _pools.get((os.getpid(), isolation, user))
    if pool is None:
        return []
    return [pid for c in list(pool.checkers) if (pid := c.frozen_pid) is not None]


def symbolic_check(golds: list[tuple[str, str]], pred: str, p: str, isolation: str = "jail",
                   user: str | None = "nobody") -> Outcome:
    """``symbolic.symbolic_check(golds, pred, p)`` in a checker: ``Outcome.value`` is the verdict (``method``:
    None or the method that found them equal, ``gold`` and ``answer`` as parsed, the check's ``cpu_s`` and
    ``wall_s`` in its cell) plus the host's view of the last run: ``wait_s`` for a free checker, ``run_s``
    (restore and cell), ``close_s``, ``runs`` and ``rebuilds``. ``ok=False`` only for what the answer caused
    (module docstring): ``timed_out`` when it spent its CPU or ran past the wall-clock limit twice."""
    pool = _pool(isolation, user)
    client = current_client()
    data = json.dumps([golds, pred, p])
    runs = rebuilds = 0
    times: dict[str, float] = {}
    while True:
        start = time.perf_counter()
        checker = pool.acquire(client)
        times["wait_s"] = time.perf_counter() - start
        try:
            if not checker.healthy():
                rebuilds = _rebuild(pool, checker, rebuilds, "its frozen fork was gone or stopped before the check")
                continue
            try:
                result = checker.run(data, times)
            except (SandboxUnavailableError, OSError) as e:
                rebuilds = _rebuild(pool, checker, rebuilds, f"the sandbox failed ({type(e).__name__}: {e})")
                continue
            verdict = _verdict(result.output) if result.status == "ok" else None
            if verdict is not None:
                if verdict["out_of_time"]:
                    return Outcome(False, error=f"the check spent its {symbolic.CPU_S:g} s of CPU", timed_out=True)
                return Outcome(True, {**verdict, **times, "runs": runs + 1, "rebuilds": rebuilds})
            healthy = checker.healthy()  # a restore that fell back has released the snapshot: the host knows
            if not healthy and result.output.startswith(_UNREADY + "\n"):
                rebuilds = _rebuild(pool, checker, rebuilds, "the restore of its snapshot fell back to a new worker")
                continue  # the answer was never read
            if healthy and result.status == "crashed" and "CPU time limit" in result.output:
                return Outcome(False, error=f"the check ran past its CPU limit ({LIMITS.cpu_s} s)", timed_out=True)
            runs += 1
            if not healthy:
                rebuilds = _rebuild(pool, checker, rebuilds, "the checker was lost during the check")
            if runs >= ANSWER_ATTEMPTS:
                what = ("timed out" if result.status == "timeout" else
                        "lost its checker" if not healthy else f"ended with status {result.status!r} and no verdict")
                return Outcome(False, error=f"the check {what}, {runs} times with this answer",
                               timed_out=result.status == "timeout")
        finally:
            pool.release(checker, client)


def _rebuild(pool: _Pool, checker: _Checker, rebuilds: int, why: str) -> int:
    """Rebuild ``checker`` for the ``rebuilds + 1``-th time in this check, or raise past ``REBUILDS``."""
    if rebuilds >= REBUILDS:
        raise CheckerUnavailableError(f"expected a working answer checker, rebuilt {rebuilds} times for one check, "
                                      f"still none: {why}; fix: check that the sandbox's own tests pass on this host")
    pool.rebuild(checker)
    return rebuilds + 1


def _verdict(output: str) -> dict[str, Any] | None:
    lines = [line for line in output.splitlines() if line.startswith(_MARK)]
    if len(lines) != 1:
        return None
    try:
        value: Any = json.loads(lines[0][len(_MARK):])
    except ValueError:
        return None
    if (isinstance(value, dict) and set(value) == _VERDICT_KEYS and value["method"] in _METHODS
            and isinstance(value["gold"], str) and isinstance(value["answer"], str)
            and isinstance(value["out_of_time"], bool)
            and all(isinstance(value[k], int | float) and not isinstance(value[k], bool) for k in ("cpu_s", "wall_s"))):
        value["gold"], value["answer"] = value["gold"][:400], value["answer"][:400]
        return value
    return None
