"""Bounded calls: run a function where it can be killed at a deadline, with its memory bounded, and without
changing any process-wide state of the caller.

An env step must return whatever the model wrote. Some steps call trusted code on untrusted input that can
run for hours or exhaust memory in C, where no thread or signal can stop it: sympy on ``\\boxed{9^{9^{9^{9}}}}``,
``mpmath`` at a million digits, ``10**10000000``; others change process-wide state (``mpmath.mp.dps``, the
``decimal`` context) that later calls would inherit. ``bounded_call(fn, *args)`` runs ``fn`` in a child of a
per-process call server (started with ``subprocess``: the caller, a trainer that imported torch, is never
forked), under RLIMIT_AS and RLIMIT_CPU; past the deadline the child is killed by pidfd and the caller gets
``Outcome(timed_out=True)``. Process-wide changes die with the child.

For your own env (opt in): make the guarded work a module-level function (it is pickled by reference, so the
server must be able to import it) whose arguments and return value pickle, and call
``bounded_call(fn, *args, bound=Bound(timeout_s=2.0))`` in ``turn``/``verify``; turn ``Outcome.ok == False``
into an error observation or a zero reward with ``outcome.error`` as the note. State that ``fn`` mutates must
travel in its arguments and come back in its result (see ``environments/bfcl/backends.py``).

Cost: a fork of the server per call (a few ms) plus pickling; the first call of a module also imports it in
the server (not counted against the deadline). Pickle is safe here because both sides run only this package's
code: the data a model wrote travels inside ordinary values, never as code.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from trace_gym.processes import register_service

_IMPORT_S = 120.0  # the server imports a function's module once, before the deadline starts
_HEADER = struct.Struct("!Q")


@dataclass(frozen=True)
class Bound:
    """Limits of one bounded call."""

    timeout_s: float = 5.0
    """Wall-clock seconds from the child's start; then it is killed."""
    memory_bytes: int = 1 << 30
    """Address space the call may add to the server's (RLIMIT_AS)."""
    max_result_bytes: int = 32 << 20
    """A larger pickled result is refused (it would have to be held by the caller)."""


@dataclass(frozen=True)
class Outcome:
    """What a bounded call gave: ``value`` if ``ok``; else ``error`` says why (timed out, out of memory, ...)."""

    ok: bool
    value: Any = None
    error: str = ""
    timed_out: bool = False


# --------------------------------------------------------------------------- framing (pickles, both sides)
def _send(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    frame = _HEADER.pack(len(payload)) + payload
    if fds:
        socket.send_fds(sock, [frame[:_HEADER.size]], fds)
        sock.sendall(frame[_HEADER.size:])
    else:
        sock.sendall(frame)


def _readable(sock: socket.socket, timeout: float) -> bool:
    """poll, not select: descriptors numbered past 1024 (a trainer holding many snapshots) break select."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


def _recv(sock: socket.socket, deadline: float | None, fds: list[int] | None = None,
          limit: int = 1 << 40) -> bytes | None:
    def exact(n: int, with_fds: bool) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not _readable(sock, left):
                    return None
            try:
                if with_fds and fds is not None:
                    chunk, got, _, _ = socket.recv_fds(sock, n - len(buf), 4)
                    fds.extend(got)
                else:
                    chunk = sock.recv(min(n - len(buf), 1 << 20))
            except (OSError, ValueError):
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    head = exact(_HEADER.size, True)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > limit:
        return None
    return exact(size, False)


# --------------------------------------------------------------------------- the server (its own process)
def _serve(fd: int) -> None:
    """Entry of the call server: one request per socket it is sent; each runs in a fork."""
    import resource

    host = socket.socket(fileno=fd)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: gone with its caller
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    warmed: set[str] = set()
    while True:
        fds: list[int] = []
        if _recv(host, None, fds) is None:
            os._exit(0)
        if len(fds) != 1:
            for f in fds:
                os.close(f)
            continue
        chan = socket.socket(fileno=fds[0])
        data = _recv(chan, time.monotonic() + 30.0)
        try:
            fn, args, kwargs, bound, warm = pickle.loads(data) if data is not None else (None, (), {}, Bound(), ())
            for name in warm:
                if name not in warmed:
                    _warm(name)
                    warmed.add(name)
        except Exception as e:  # the module cannot be imported here, or the data does not unpickle
            with contextlib.suppress(OSError):
                _send(chan, pickle.dumps(("error", f"the call server cannot load the call: {type(e).__name__}: {e}")))
            chan.close()
            continue
        if fn is None:
            chan.close()
            continue
        if os.fork() == 0:
            host.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            with contextlib.suppress(Exception):
                import ctypes

                ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
            _run_child(chan, fn, args, kwargs, bound, resource)
        chan.close()  # from the fork on, the child is the socket's only writer


def _warm(name: str) -> None:
    """Import ``module`` or call ``module:function`` once in the server, so that every child starts warm."""
    import importlib

    module, _, function = name.partition(":")
    loaded = importlib.import_module(module)
    if function:
        getattr(loaded, function)()


def _run_child(chan: socket.socket, fn: Callable[..., Any], args: tuple, kwargs: dict, bound: Bound,
               resource: Any) -> None:
    with open("/proc/self/status") as f:
        vm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (vm + bound.memory_bytes, vm + bound.memory_bytes))
    cpu = int(bound.timeout_s) + 2
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    pidfd = os.pidfd_open(os.getpid())  # the caller's handle to kill this child at the deadline
    _send(chan, pickle.dumps(("started", None)), [pidfd])
    os.close(pidfd)
    try:
        reply = ("ok", fn(*args, **kwargs))
    except MemoryError:
        reply = ("error", f"out of memory (limit {bound.memory_bytes} bytes)")
    except BaseException as e:
        reply = ("error", f"{type(e).__name__}: {e}"[:2000])
    try:
        payload = pickle.dumps(reply)
    except Exception as e:
        payload = pickle.dumps(("error", f"the result does not pickle: {type(e).__name__}: {e}"))
    if len(payload) > bound.max_result_bytes:
        payload = pickle.dumps(("error", f"the result is too large ({len(payload)} bytes pickled)"))
    with contextlib.suppress(OSError):
        _send(chan, payload)
    os._exit(0)


# --------------------------------------------------------------------------- the caller's side
class _Server:
    _instance: ClassVar[_Server | None] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = f"from trace_gym.environments.sandbox.bounded import _serve; _serve({theirs.fileno()})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        register_service(self.proc.pid)
        self.sock, self.owner, self.lock = ours, os.getpid(), threading.Lock()
        atexit.register(self.shutdown)

    @classmethod
    def get(cls) -> _Server:
        with cls._lock:
            s = cls._instance
            if s is None or s.owner != os.getpid() or s.proc.poll() is not None:
                cls._instance = s = cls()
            return s

    def shutdown(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.sock.close()


def start_server() -> int:
    """Start this process's call server now rather than at the first bounded call; returns its pid. It lives
    until this process exits: leak checks should take their baseline after calling this."""
    return _Server.get().proc.pid


def bounded_call(fn: Callable[..., Any], *args: Any, bound: Bound | None = None, warm: tuple[str, ...] = (),
                 **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` in a killable child; never raises for what the call does (see the module doc).

    ``warm``: modules (``"pkg.mod"``) to import, or functions (``"pkg.mod:fn"``) to call, once in the server
    before its first such call, so that children do not each pay for them (lazy imports, parser tables)."""
    bound = bound or Bound()
    try:
        payload = pickle.dumps((fn, args, kwargs, bound, tuple(warm)))
    except Exception as e:
        return Outcome(False, error=f"expected a picklable module-level function and arguments, got "
                                     f"{type(e).__name__}: {e}; fix: define the function at module level")
    server = _Server.get()
    ours, theirs = socket.socketpair()
    try:
        with server.lock:
            _send(server.sock, b"call", [theirs.fileno()])
        theirs.close()
        _send(ours, payload)
        return _await(ours, bound)
    except OSError as e:
        return Outcome(False, error=f"the call server failed: {e}")
    finally:
        with contextlib.suppress(OSError):
            theirs.close()
        ours.close()


def _await(sock: socket.socket, bound: Bound) -> Outcome:
    pidfd: int | None = None
    deadline = time.monotonic() + _IMPORT_S
    try:
        while True:
            fds: list[int] = []
            data = _recv(sock, deadline, fds, limit=bound.max_result_bytes + 4096)
            for fd in fds:
                if pidfd is None:
                    pidfd = fd
                else:
                    os.close(fd)
            if data is None:
                if pidfd is not None and time.monotonic() >= deadline:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    return Outcome(False, error=f"timed out after {bound.timeout_s:g} s", timed_out=True)
                return Outcome(False, error="the call's process died (CPU or memory limit, or a crash)")
            kind, value = pickle.loads(data)
            if kind == "started":
                deadline = time.monotonic() + bound.timeout_s
                continue
            return Outcome(True, value) if kind == "ok" else Outcome(False, error=str(value))
    finally:
        if pidfd is not None:
            os.close(pidfd)
