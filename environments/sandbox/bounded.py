"""Bounded calls: run a function where it can be killed at a deadline, with its memory bounded, and without
changing any process-wide state of the caller.

An env step must return whatever the model wrote. Some steps call trusted code on untrusted input that can
run for hours or exhaust memory in C, where no thread or signal can stop it: sympy on ``\\boxed{9^{9^{9^{9}}}}``,
``mpmath`` at a million digits, ``10**10000000``; others change process-wide state (``mpmath.mp.dps``, the
``decimal`` context) that later calls would inherit. ``bounded_call(fn, *args)`` runs ``fn`` in a child of a
per-process call server (started with ``subprocess``: the caller, a trainer that imported torch, is never
forked), under RLIMIT_AS and RLIMIT_CPU; past the deadline the child is killed by pidfd and the caller gets
``Outcome(timed_out=True)``. Process-wide changes die with the child.

For your own env (opt in): make the guarded work a module-level function (it travels by name, so the server
must be able to import it) whose arguments and return value are plain data (``values.py``: scalars, lists,
tuples, dicts, sets, bytes, dates, ``random.Random``, and objects of the classes you name in ``classes=``), and
call ``bounded_call(fn, *args, bound=Bound(timeout_s=2.0))`` in ``turn``/``verify``; turn ``Outcome.ok == False``
into an error observation or a zero reward with ``outcome.error`` as the note. State that ``fn`` mutates must
travel in its arguments and come back in its result (see ``environments/bfcl/backends.py``).

Everything travels as length-prefixed JSON (``wire.py``), never as pickles: the child works on untrusted input,
so its reply is read as data that cannot carry code, whatever the child was made to send.

Cost: a fork of the server per call (a few ms) plus the JSON coding; the first call of a module also imports it
in the server (not counted against the deadline).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from trace_gym.environments.sandbox import lifetime, values, wire
from trace_gym.processes import register_service

_IMPORT_S = 120.0  # the server imports a function's module once, before the deadline starts
_CODING_ERRORS = (ValueError, TypeError, OverflowError, RecursionError)  # what decoding malformed data raises


@dataclass(frozen=True)
class Bound:
    """Limits of one bounded call."""

    timeout_s: float = 5.0
    """Wall-clock seconds from the child's start; then it is killed."""
    memory_bytes: int = 1 << 30
    """Address space the call may add to the server's (RLIMIT_AS)."""
    max_result_bytes: int = 32 << 20
    """A larger result (as JSON) is refused (it would have to be held by the caller)."""


@dataclass(frozen=True)
class Outcome:
    """What a bounded call gave: ``value`` if ``ok``; else ``error`` says why (timed out, out of memory, ...)."""

    ok: bool
    value: Any = None
    error: str = ""
    timed_out: bool = False


# --------------------------------------------------------------------------- names of functions and classes
def _name(obj: Any) -> str:
    """``module:qualname`` of a module-level function or class; ValueError if it cannot be found by that name."""
    name = f"{getattr(obj, '__module__', None)}:{getattr(obj, '__qualname__', None)}"
    try:
        found = _resolve(name)
    except (ImportError, AttributeError, ValueError):
        found = None
    if found is not obj:
        raise ValueError(f"{obj!r} cannot be found by its name {name}")
    return name


def _resolve(name: str) -> Any:
    module, _, qualname = name.partition(":")
    if not module or not qualname or "<" in qualname:
        raise ValueError(f"not a module-level name: {name}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


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
        if wire.recv(host, None, fds) is None:
            os._exit(0)
        if len(fds) != 1:
            for f in fds:
                os.close(f)
            continue
        chan = socket.socket(fileno=fds[0])
        request = wire.recv(chan, time.monotonic() + 30.0, limit=1 << 31)
        if request is None:
            chan.close()
            continue
        try:  # the request comes from the caller, which names only its own functions and classes
            for name in request["warm"]:
                if name not in warmed:
                    _warm(name)
                    warmed.add(name)
            fn = _resolve(request["fn"])
            classes = tuple(_resolve(c) for c in request["classes"])
            args, kwargs = values.decode(request["args"], classes), values.decode(request["kwargs"], classes)
            bound = Bound(**request["bound"])
        except Exception as e:  # the module cannot be imported here, or the data does not decode
            with contextlib.suppress(OSError):
                wire.send(chan, {"kind": "error", "error": f"the call server cannot load the call: "
                                                           f"{type(e).__name__}: {e}"[:2000]})
            chan.close()
            continue
        if os.fork() == 0:
            host.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            with contextlib.suppress(Exception):
                import ctypes

                ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
            _run_child(chan, fn, args, kwargs, bound, classes, resource)
        chan.close()  # from the fork on, the child is the socket's only writer


def _warm(name: str) -> None:
    """Import ``module`` or call ``module:function`` once in the server, so that every child starts warm."""
    module, _, function = name.partition(":")
    loaded = importlib.import_module(module)
    if function:
        getattr(loaded, function)()


def _run_child(chan: socket.socket, fn: Callable[..., Any], args: tuple, kwargs: dict, bound: Bound,
               classes: tuple[type, ...], resource: Any) -> None:
    with open("/proc/self/status") as f:
        vm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (vm + bound.memory_bytes, vm + bound.memory_bytes))
    cpu = int(bound.timeout_s) + 2
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    pidfd = os.pidfd_open(os.getpid())  # the caller's handle to kill this child at the deadline
    wire.send(chan, {"kind": "started"}, [pidfd])
    os.close(pidfd)
    try:
        reply: dict[str, Any] = {"kind": "ok", "value": values.encode(fn(*args, **kwargs), classes)}
    except MemoryError:
        reply = {"kind": "error", "error": f"out of memory (limit {bound.memory_bytes} bytes)"}
    except BaseException as e:
        reply = {"kind": "error", "error": f"{type(e).__name__}: {e}"[:2000]}
    try:
        size = len(json.dumps(reply))  # characters: the bytes of ASCII JSON
    except Exception as e:
        reply, size = {"kind": "error", "error": f"the result is not JSON: {type(e).__name__}: {e}"[:2000]}, 0
    if size > bound.max_result_bytes:
        reply = {"kind": "error", "error": f"the result is too large ({size} bytes as JSON)"}
    with contextlib.suppress(OSError):
        wire.send(chan, reply)
    os._exit(0)


# --------------------------------------------------------------------------- the caller's side
class _Server:
    _instance: ClassVar[_Server | None] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = f"from trace_gym.environments.sandbox.bounded import _serve; _serve({theirs.fileno()})"
        # forked by the owner thread: the server's parent-death signal fires when the forking thread ends
        self.proc = lifetime.popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()], env=env,
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
                 classes: tuple[type, ...] = (), **kwargs: Any) -> Outcome:
    """``fn(*args, **kwargs)`` in a killable child; never raises for what the call does (see the module doc).

    ``warm``: modules (``"pkg.mod"``) to import, or functions (``"pkg.mod:fn"``) to call, once in the server
    before its first such call, so that children do not each pay for them (lazy imports, parser tables).
    ``classes``: the classes whose objects may travel in the arguments and the result (``values.py``)."""
    bound = bound or Bound()
    try:
        request = {"fn": _name(fn), "classes": [_name(c) for c in classes], "warm": list(warm),
                   "args": values.encode(list(args), classes), "kwargs": values.encode(kwargs, classes),
                   "bound": asdict(bound)}
    except ValueError as e:
        return Outcome(False, error=f"expected a module-level function and plain-data arguments, got {e}; "
                                    "fix: define the function at module level and pass data (see values.py)")
    server = _Server.get()
    ours, theirs = socket.socketpair()
    try:
        with server.lock:
            wire.send(server.sock, {"op": "call"}, [theirs.fileno()])
        theirs.close()
        wire.send(ours, request)
        return _await(ours, bound, classes)
    except OSError as e:
        return Outcome(False, error=f"the call server failed: {e}")
    finally:
        with contextlib.suppress(OSError):
            theirs.close()
        ours.close()


def _await(sock: socket.socket, bound: Bound, classes: tuple[type, ...]) -> Outcome:
    """Wait for the child's reply, killing it at the deadline. The reply is untrusted data: JSON, decoded with
    only ``classes`` allowed."""
    pidfd: int | None = None
    deadline = time.monotonic() + _IMPORT_S
    try:
        while True:
            fds: list[int] = []
            reply = wire.recv(sock, deadline, fds, limit=bound.max_result_bytes + 4096)
            for fd in fds:
                if pidfd is None:
                    pidfd = fd
                else:
                    os.close(fd)
            if reply is None:
                if pidfd is not None and time.monotonic() >= deadline:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    return Outcome(False, error=f"timed out after {bound.timeout_s:g} s", timed_out=True)
                return Outcome(False, error="the call's process died (CPU or memory limit, or a crash) "
                                            "or sent no valid reply")
            kind = reply.get("kind")
            if kind == "started":
                deadline = time.monotonic() + bound.timeout_s
                continue
            if kind == "ok":
                try:
                    return Outcome(True, values.decode(reply.get("value"), classes))
                except _CODING_ERRORS as e:
                    return Outcome(False, error=f"the call's reply does not decode: {e}"[:2000])
            return Outcome(False, error=str(reply.get("error"))[:2000])
    finally:
        if pidfd is not None:
            os.close(pidfd)
