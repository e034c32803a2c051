"""A sandboxed, persistent, forkable Python interpreter for tool-using agents.

Processes (each arrow is a ``fork``):

    host (trainer) ──spawn──> zygote ──> worker W ──per cell──> child C ──(on success)──> C is the new W
                                              └──snapshot──> frozen fork F ──restore──> worker W'

- The **zygote** is one long-lived template per host process, started with ``subprocess`` from this file as a
  script (``python -I``: no torch, no trainer state, a scrubbed environment) with math, numpy, sympy,
  fractions and itertools imported. A new episode forks from it in milliseconds.
- A **worker** owns one episode's interpreter state. It never runs model code itself: each cell runs in a
  child ``C`` forked from it, with CPU, address-space, file-size and process-count limits set in ``C`` (a
  CPU limit on the worker would end the episode) and its own process group. When the cell finishes, ``C``
  *becomes the worker* (it holds the state the cell produced) and the old worker exits: state carries
  across cells exactly, and a cell that crashes, hangs or exits leaves the previous worker, with the
  pre-cell state, in charge. A cell that raises keeps its partial effects (notebook semantics).
- A **native snapshot** is a frozen fork ``F`` of the worker (exact interpreter state plus a copy of the
  working directory). Restoring forks ``F`` again, so a snapshot restored k times gives k independent
  workers. ``release()`` (or garbage collection) ends ``F``. A **portable** snapshot is the list of
  committed cells; restoring it replays them in a fresh worker.

Messages are length-prefixed JSON (never pickle: anything a sandbox process sends is untrusted) over Unix
sockets; sockets travel with ``SCM_RIGHTS``. The host bounds every wait; if a worker dies anyway (a cell
that kills its own parent through ctypes), the host rebuilds the state by replaying the committed cells.

What is guaranteed, and what is not:
1. Resource limits (kernel-enforced per cell): CPU seconds, address space, file size, wall-clock time (the
   worker kills the cell's process group), output size (truncated with a note).
2. Run as root (as in our containers), each worker enters a new network namespace (no interfaces but a
   down loopback: connections fail in the kernel) and then drops to an unprivileged user (``nobody``): a
   cell cannot signal the trainer, read its ``/proc/<pid>/environ``, or write where ``nobody`` may not.
   ``RLIMIT_NPROC`` then caps the processes of that user (all sandboxes and snapshots share the count).
   Not root: no namespace and no user switch; only layers 3-4 below apply to network and signals.
3. The environment is scrubbed (the zygote starts with a fixed, minimal environment), the working
   directory is a private temporary directory removed at close.
4. An audit hook (``sys.addaudithook``; it cannot be removed from Python) refuses, while model code runs:
   sockets other than AF_UNIX, process creation (fork, exec, spawn, system, subprocess), signals to other
   processes, rlimit changes, loading new C libraries with ctypes, and opening files for writing, renaming
   or deleting outside the working directory. Audit hooks are a tripwire, not a security boundary: code
   that reaches raw memory through ctypes can bypass them. World-writable places (/tmp, /dev/shm) are
   writable by ``nobody`` at the kernel level if the hook is bypassed.
5. Not a jail: the filesystem is readable as far as ``nobody`` (or the host user) can read it; there is no
   seccomp filter and no disk quota beyond the per-file size limit. Run untrusted code at scale inside a
   container or VM as well.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any

_MAX_MESSAGE = 8 << 20  # bytes; a larger frame from a sandbox process is treated as garbage
_PRELOAD = ("math", "cmath", "fractions", "itertools", "functools", "collections", "decimal", "statistics",
            "random", "re", "numpy", "sympy")
# Imported by the template but not bound in the namespace: after the switch to an unprivileged user the
# interpreter's own files may be unreadable (a Python under /root), so a cell's `import heapq` must be cached.
_WARM = ("resource", "traceback", "linecache", "tokenize", "ctypes", "heapq", "bisect", "string", "operator",
         "datetime", "json", "copy", "numbers", "typing", "dataclasses", "textwrap", "time", "calendar", "array",
         "struct", "hashlib", "base64", "pprint", "enum", "io", "warnings", "secrets", "unicodedata", "csv",
         "numpy.linalg", "numpy.random", "numpy.polynomial", "numpy.fft", "sympy.ntheory", "sympy.solvers",
         "sympy.parsing.sympy_parser", "mpmath")
_SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-cell limits. Every field is enforced in the cell's own process."""

    timeout_s: float = 10.0
    """Wall-clock seconds per cell; the cell's process group is killed after it."""
    cpu_s: int = 10
    """CPU seconds per cell (RLIMIT_CPU)."""
    memory_bytes: int = 2 << 30
    """Address space of the cell process (RLIMIT_AS); exceeding it raises MemoryError in the cell."""
    file_bytes: int = 16 << 20
    """Largest file a cell may write (RLIMIT_FSIZE)."""
    processes: int = 4096
    """RLIMIT_NPROC. Linux counts every process of the sandbox user, snapshots included."""
    max_output_chars: int = 4000
    """Printed output plus the last value kept per cell; the rest is cut with a note."""
    traceback_lines: int = 6
    """Last lines of a traceback reported for an exception."""


@dataclass(frozen=True)
class CellResult:
    """What one cell produced. ``status``: ok | error (an exception) | timeout | crashed | sandbox_error."""

    output: str
    status: str = "ok"
    committed: bool = True  # the cell's effects on the interpreter state were kept

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# --------------------------------------------------------------------------- framing (both sides)
def _send(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame[:4]], fds)
        sock.sendall(frame[4:])
    else:
        sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None, fds: list[int] | None) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                return None
        try:
            if fds is not None:
                chunk, got, _, _ = socket.recv_fds(sock, n - len(buf), 4)
                fds.extend(got)
            else:
                chunk = sock.recv(n - len(buf))
        except (OSError, ValueError):
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, deadline: float | None = None,
          fds: list[int] | None = None) -> dict[str, Any] | None:
    """One message, or None on EOF, timeout or garbage (a sandbox process may send anything)."""
    head = _recv_exact(sock, 4, deadline, fds)
    if head is None:
        return None
    (size,) = struct.unpack("!I", head)
    if size > _MAX_MESSAGE:
        return None
    body = _recv_exact(sock, size, deadline, None)
    if body is None:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


# --------------------------------------------------------------------------- sandbox side
class _Capture:
    """sys.stdout/sys.stderr for a cell: keeps the first ``limit`` characters, counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0
        self.closed = False

    def write(self, s: Any) -> int:
        s = str(s)
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def text(self) -> str:
        out = "".join(self.parts)
        if self.dropped:
            out += f"\n[output truncated: {self.dropped} more characters not shown]"
        return out.encode("utf-8", "replace").decode("utf-8")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True  # a cell may close stdout; the captured text stays readable

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("the sandbox's stdout has no file descriptor")


class _Guard:
    """The audit-hook layer. ``untrusted`` is True only while model code runs."""

    untrusted = False
    workdir = "/"
    _blocked_events = frozenset({
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
        "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "ctypes.dlopen",
        "os.setuid", "os.setgid", "os.chroot", "pty.spawn", "os.startfile", "webbrowser.open", "sys.addaudithook",
    })
    _path_events = frozenset({"os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink", "os.truncate",
                              "os.chmod", "os.chown", "os.utime", "os.mkdir", "shutil.rmtree", "os.mkfifo"})

    @classmethod
    def inside(cls, path: Any) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor was checked when it was opened
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == cls.workdir or real.startswith(cls.workdir + os.sep) or real == os.devnull

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if not cls.untrusted:
            return
        if event in cls._blocked_events:
            if event in ("os.kill", "os.killpg") and args and args[0] in (0, os.getpid()):
                return  # signalling itself only ends the cell
            raise PermissionError(f"blocked in the sandbox: {event}")
        if event == "socket.__new__" and len(args) > 1 and args[1] not in (socket.AF_UNIX, -1):
            raise PermissionError("blocked in the sandbox: network sockets")
        if event in ("socket.connect", "socket.bind", "socket.sendto") and len(args) > 1 \
                and not isinstance(args[1], str | bytes):
            raise PermissionError("blocked in the sandbox: network access")
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1] or "", args[2] or 0
            writes = any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            if writes and not cls.inside(path):
                raise PermissionError(f"blocked in the sandbox: writing outside the working directory: {path!r}")
        elif event in cls._path_events and args and not all(cls.inside(a) for a in args[:2]
                                                              if isinstance(a, str | bytes | os.PathLike)):
            raise PermissionError(f"blocked in the sandbox: {event} outside the working directory")


def _reap_zombies() -> None:
    """Collect children that exited while SIGCHLD was at its default disposition."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _prctl_pdeathsig(sig: int) -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG


def _prctl_subreaper() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _execute(code: str, namespace: dict[str, Any], limits: dict[str, Any]) -> tuple[str, str]:
    """Run a cell notebook-style in ``namespace``; returns (output, status)."""
    import traceback

    cap = _Capture(int(limits["max_output_chars"]))
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = cap
    status = "ok"
    _Guard.untrusted = True
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
            if value is not None:
                cap.write(repr(value) + "\n")
    except SystemExit as exc:
        cap.write(f"SystemExit: {exc.code}\n")
    except BaseException as exc:  # the model's exception, reported as text
        status = "error"
        try:
            te = traceback.TracebackException.from_exception(exc)
            te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
            lines = "".join(te.format()).rstrip("\n").split("\n")
            cap.write("\n".join(lines[-int(limits["traceback_lines"]):]) + "\n")
        except BaseException:
            cap.write(f"{type(exc).__name__}\n")
    finally:
        _Guard.untrusted = False
        sys.stdout, sys.stderr = saved
    return cap.text(), status


class _Runtime:
    """The loop of a sandbox process: a worker (``serve``) or a frozen fork (``freeze``)."""

    def __init__(self, namespace: dict[str, Any]):
        self.ns = namespace

    def _fork(self) -> int:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a cell may have tampered with it
        import random

        state = random.getstate()
        pid = os.fork()
        if pid == 0:
            random.setstate(state)  # `random` reseeds after fork; forks must continue the same stream
        return pid

    def serve(self, sock: socket.socket) -> None:
        while True:
            fds: list[int] = []
            msg = _recv(sock, None, fds)
            if msg is None or msg.get("op") == "close":
                os._exit(0)
            op = msg.get("op")
            if op == "exec":
                sock = self._exec(sock, str(msg.get("code", "")), msg.get("limits", {}))
            elif op == "snapshot" and fds:
                self._snapshot(sock, socket.socket(fileno=fds[0]), str(msg["dir"]))
            else:
                for fd in fds:
                    os.close(fd)
                _send(sock, {"error": f"unknown request {op!r}"})

    def _exec(self, host: socket.socket, code: str, limits: dict[str, Any]) -> socket.socket:
        mine, theirs = socket.socketpair()
        pid = self._fork()
        if pid == 0:  # the cell child
            mine.close()
            host_fd = host.detach()
            os.close(host_fd)  # the cell gets the host channel back only if it finishes
            os.setpgid(0, 0)
            _prctl_pdeathsig(signal.SIGKILL)
            _set_limits(limits)
            output, status = _execute(code, self.ns, limits)
            with contextlib.suppress(OSError):
                _send(theirs, {"output": output, "status": status})
            fds: list[int] = []
            commit = _recv(theirs, None, fds)
            if commit is None or not fds:
                os._exit(0)
            _prctl_pdeathsig(0)
            import resource

            _, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))  # room for the worker's own bookkeeping
            new_host = socket.socket(fileno=fds[0])
            _send(theirs, {"ack": True})
            theirs.close()
            return new_host  # this process is the worker now
        theirs.close()
        deadline = time.monotonic() + float(limits.get("timeout_s", 10.0))
        result = _recv(mine, deadline)
        if result is not None:
            _send(mine, {"commit": True}, [host.fileno()])
            if _recv(mine, time.monotonic() + 10.0) is not None:
                output = result.get("output")
                _send(host, {"output": output if isinstance(output, str) else "",
                             "status": "error" if result.get("status") == "error" else "ok",
                             "committed": True, "pid": pid, "exiting": os.getpid()})
                os._exit(0)  # the child holds the new state; it has the host channel
        timed_out = result is None and time.monotonic() >= deadline
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        mine.close()
        if timed_out:
            text, kind = f"Timeout: the cell ran longer than {limits.get('timeout_s')} s and was killed.", "timeout"
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            reason = {"SIGXCPU": "CPU time limit exceeded", "SIGKILL": "killed (CPU or memory limit)",
                      "SIGSEGV": "segmentation fault", "SIGXFSZ": "file size limit exceeded"}.get(name, name)
            text, kind = f"Crashed: the cell's process died ({reason}).", "crashed"
        else:
            text, kind = f"Crashed: the cell exited with status {os.waitstatus_to_exitcode(status)}.", "crashed"
        _send(host, {"output": text + " Its changes were discarded; earlier state is intact.", "status": kind,
                     "committed": False, "pid": os.getpid()})
        return host

    def _snapshot(self, host: socket.socket, channel: socket.socket, directory: str) -> None:
        shutil.copytree(os.getcwd(), directory, dirs_exist_ok=True, symlinks=True)
        pid = self._fork()
        if pid == 0:
            host.close()
            os.setpgid(0, 0)
            self.freeze(channel, directory, setup=False)
        channel.close()
        _send(host, {"pid": pid})

    def freeze(self, sock: socket.socket, directory: str | None, setup: bool) -> None:
        """Serve spawn requests: each forks a worker holding this process's state. Never returns."""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # spawned workers are reaped automatically
        while True:
            fds: list[int] = []
            msg = _recv(sock, None, fds)
            if msg is None or msg.get("op") != "spawn" or not fds:
                os._exit(0)
            pid = self._fork()
            if pid != 0:
                # _fork restored the default SIGCHLD disposition; a template or frozen snapshot must keep
                # reaping, or every finished worker stays a zombie and counts against RLIMIT_NPROC.
                signal.signal(signal.SIGCHLD, signal.SIG_IGN)
                _reap_zombies()
            if pid == 0:
                sock.close()
                channel = socket.socket(fileno=fds[0])
                workdir = str(msg["workdir"])
                if directory:
                    shutil.copytree(directory, workdir, dirs_exist_ok=True, symlinks=True)
                if setup:
                    _setup_worker(msg)
                with contextlib.suppress(OSError):
                    os.setpgid(0, 0)
                os.chdir(workdir)
                _Guard.workdir = os.path.realpath(workdir)
                _send(channel, {"pid": os.getpid()})
                self.serve(channel)
            os.close(fds[0])


def _setup_worker(msg: dict[str, Any]) -> None:
    """First-time isolation of a worker forked from the zygote: own session, no network, no privileges."""
    os.setsid()
    os.umask(0o077)
    if os.geteuid() == 0:
        with contextlib.suppress(OSError, AttributeError):
            os.unshare(os.CLONE_NEWNET)
        uid, gid = msg.get("uid"), msg.get("gid")
        if isinstance(uid, int) and isinstance(gid, int):
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)


def _set_limits(limits: dict[str, Any]) -> None:
    import resource

    cpu = int(limits.get("cpu_s", 10))
    for name, value in ((resource.RLIMIT_CPU, (cpu, cpu + 2)),
                        (resource.RLIMIT_AS, int(limits.get("memory_bytes", 2 << 30))),
                        (resource.RLIMIT_FSIZE, int(limits.get("file_bytes", 16 << 20))),
                        (resource.RLIMIT_NPROC, int(limits.get("processes", 4096))),
                        (resource.RLIMIT_CORE, 0)):
        soft, hard = value if isinstance(value, tuple) else (value, value)
        _, current = resource.getrlimit(name)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(name, (soft, hard))


def _zygote_main(fd: int) -> None:
    """Entry of the template process (``python -I sandbox.py <fd>``)."""
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    for name in _PRELOAD:
        with contextlib.suppress(ImportError):
            namespace[name] = importlib.import_module(name)
    if "numpy" in namespace:
        namespace["np"] = namespace["numpy"]
    if "sympy" in namespace:
        namespace["sp"] = namespace["sympy"]
    namespace["Fraction"] = namespace["fractions"].Fraction
    namespace["Decimal"] = namespace["decimal"].Decimal
    for name in _WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import ctypes  # noqa: F401 - loaded before the audit hook refuses new libraries

    sys.addaudithook(_Guard.hook)
    _prctl_subreaper()  # orphaned workers (the old worker exits at each commit) are reparented here
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1) if os.environ.get("TRACE_SANDBOX_DEBUG") else (0, 1, 2):
        os.dup2(devnull, target)  # C-level writes of a cell go nowhere
    _Runtime(namespace).freeze(socket.socket(fileno=fd), None, setup=True)


# --------------------------------------------------------------------------- host side
def _kill(pid: int | None) -> None:
    """SIGKILL ``pid`` and wait (briefly) until it is gone: callers count processes right after closing."""
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    for _ in range(200):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return
        if stat[stat.rfind(")") + 2 :].startswith(("Z", "X")):
            return
        time.sleep(0.001)


class _Zygote:
    """The template process of this host process (one per pid: a forked host starts its own)."""

    _instance: _Zygote | None = None
    _lock = threading.Lock()

    def __init__(self, user: str | None):
        ours, theirs = socket.socketpair()
        self.uid = self.gid = None
        if os.geteuid() == 0 and user:
            import pwd

            entry = pwd.getpwnam(user)
            self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.root = tempfile.mkdtemp(prefix="trace-sandbox-")
        if self.uid is not None:
            os.chmod(self.root, 0o711)
        self.proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=_sandbox_env(), cwd=self.root,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=None if os.environ.get("TRACE_SANDBOX_DEBUG") else subprocess.DEVNULL,
                                     close_fds=True)
        theirs.close()
        self.sock, self.owner, self.lock = ours, os.getpid(), threading.Lock()
        atexit.register(self.shutdown)

    @classmethod
    def get(cls, user: str | None = "nobody") -> _Zygote:
        with cls._lock:
            z = cls._instance
            if z is None or z.owner != os.getpid() or z.proc.poll() is not None:
                cls._instance = z = cls(user)
            return z

    def new_dir(self, prefix: str) -> str:
        path = tempfile.mkdtemp(prefix=prefix, dir=self.root)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)
        return path

    def shutdown(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.sock.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _sandbox_env() -> dict[str, str]:
    debug = os.environ.get("TRACE_SANDBOX_DEBUG")  # keeps the template's stderr, for developing the sandbox
    return dict(_SANDBOX_ENV, TRACE_SANDBOX_DEBUG=debug) if debug else dict(_SANDBOX_ENV)


def _spawn(spawner: socket.socket, lock: threading.Lock, workdir: str, zygote: _Zygote,
           timeout: float = 30.0) -> tuple[socket.socket, int]:
    """Ask a zygote or frozen fork for a new worker; returns its channel and pid."""
    ours, theirs = socket.socketpair()
    with lock:
        _send(spawner, {"op": "spawn", "workdir": workdir, "uid": zygote.uid, "gid": zygote.gid},
              [theirs.fileno()])
    theirs.close()
    reply = _recv(ours, time.monotonic() + timeout)
    if reply is None or not isinstance(reply.get("pid"), int):
        ours.close()
        raise RuntimeError("the sandbox template did not start a worker")
    return ours, reply["pid"]


class _Frozen:
    """OS resources of a native snapshot: the frozen process, its channel, its directory copy."""

    def __init__(self, sock: socket.socket, pid: int, directory: str):
        self.sock, self.pid, self.directory, self.lock = sock, pid, directory, threading.Lock()

    @staticmethod
    def free(sock: socket.socket, pid: int, directory: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()
        _kill(pid)
        shutil.rmtree(directory, ignore_errors=True)


class SandboxSnapshot:
    """A frozen copy of a sandbox. Native: a frozen fork (``release()`` ends it); always: the cell list."""

    def __init__(self, cells: tuple[str, ...], frozen: _Frozen | None, limits: SandboxLimits):
        self.cells, self.limits, self._frozen = cells, limits, frozen
        self.kind = "native" if frozen is not None else "replay"
        self._finalizer = (weakref.finalize(self, _Frozen.free, frozen.sock, frozen.pid, frozen.directory)
                           if frozen is not None else None)

    @property
    def alive(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


class PythonSandbox:
    """One episode's persistent Python interpreter. ``run(code)`` executes a cell and returns its result.

    The worker process starts lazily at the first cell, so episodes that never call the tool cost nothing.
    """

    def __init__(self, limits: SandboxLimits | None = None, user: str | None = "nobody"):
        self.limits = limits or SandboxLimits()
        self.user = user
        self.cells: list[str] = []  # committed cells, in order (the portable state)
        self._sock: socket.socket | None = None
        self._pids: list[int] = []  # the current worker's pid, shared with the finalizer
        self._workdir: str | None = None
        self._source: SandboxSnapshot | None = None  # the snapshot the next worker starts from
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        return self._pids[0] if self._pids else None

    @property
    def workdir(self) -> str | None:
        return self._workdir

    def _start(self) -> None:
        """Start a worker holding ``self.cells``: fork the source snapshot if alive, replay what it lacks."""
        zygote = _Zygote.get(self.user)
        workdir = zygote.new_dir("w-")
        source, done = self._source, 0
        if source is not None and source.alive:
            frozen = source._frozen
            assert frozen is not None
            sock, pid = _spawn(frozen.sock, frozen.lock, workdir, zygote)
            done = len(source.cells)
        else:
            sock, pid = _spawn(zygote.sock, zygote.lock, workdir, zygote)
        self._sock, self._workdir, self._pids = sock, workdir, [pid]
        self._finalizer = weakref.finalize(self, PythonSandbox._free, sock, self._pids, workdir)
        for code in self.cells[done:]:
            self._exec(code)

    @staticmethod
    def _free(sock: socket.socket, pids: list[int], workdir: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()  # the worker exits on EOF
        for pid in pids:
            _kill(pid)
        shutil.rmtree(workdir, ignore_errors=True)

    def close(self) -> None:
        """End the worker and remove its working directory (idempotent). Snapshots stay valid."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer, self._sock, self._pids, self._workdir = None, None, [], None

    def reset(self) -> None:
        """Forget all state: the next cell starts a fresh worker from the template."""
        self.close()
        self.cells, self._source = [], None

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str) -> CellResult:
        """Execute ``code`` in the episode's namespace. Never raises on model input."""
        if not isinstance(code, str):
            return CellResult(f"Error: expected code as a string, got {type(code).__name__}", "sandbox_error", False)
        if self._sock is None:
            self._start()
        result = self._exec(code)
        if result is None:  # the worker itself died (a cell that killed it): rebuild the state by replay
            self.close()
            self._start()
            return CellResult("Crashed: the cell ended the sandbox process; the earlier state was rebuilt by "
                              "re-running the previous cells.", "crashed", False)
        if result.committed:
            self.cells.append(code)
        return result

    def _exec(self, code: str) -> CellResult | None:
        """One cell in the current worker; None if the worker is gone or misbehaves."""
        assert self._sock is not None
        try:
            _send(self._sock, {"op": "exec", "code": code, "limits": asdict(self.limits)})
        except OSError:
            return None
        reply = _recv(self._sock, time.monotonic() + self.limits.timeout_s + 15.0)
        if reply is None or not isinstance(reply.get("pid"), int):
            return None
        # After a commit the cell's process is the worker; the old one is exiting (close() makes sure of it).
        self._pids[:] = [reply["pid"]] + [p for p in [reply.get("exiting")] if isinstance(p, int)]
        output = reply.get("output")
        output = output if isinstance(output, str) else ""
        if len(output) > self.limits.max_output_chars + 200:
            output = output[: self.limits.max_output_chars] + "\n[output truncated]"
        status = reply.get("status") if reply.get("status") in ("ok", "error", "timeout", "crashed") else "ok"
        return CellResult(output, str(status), bool(reply.get("committed")))

    def snapshot(self, native: bool = True) -> SandboxSnapshot:
        """Freeze the current state. ``native``: a frozen fork; otherwise the cell list only (replayable)."""
        cells = tuple(self.cells)
        if not native or not cells:
            return SandboxSnapshot(cells, None, self.limits)  # no cell run yet: a fresh worker is the state
        if self._sock is None:
            self._start()
        assert self._sock is not None
        zygote = _Zygote.get(self.user)
        directory = zygote.new_dir("s-")
        ours, theirs = socket.socketpair()
        with contextlib.suppress(OSError):
            _send(self._sock, {"op": "snapshot", "dir": directory}, [theirs.fileno()])
        theirs.close()
        reply = _recv(self._sock, time.monotonic() + 30.0)
        if reply is None or not isinstance(reply.get("pid"), int):
            ours.close()
            shutil.rmtree(directory, ignore_errors=True)
            return SandboxSnapshot(cells, None, self.limits)  # portable fallback: replay restores it
        return SandboxSnapshot(cells, _Frozen(ours, reply["pid"], directory), self.limits)

    def restore(self, snapshot: SandboxSnapshot) -> None:
        """Replace the state by ``snapshot``'s; the snapshot stays reusable. The worker starts lazily, at the
        next cell, so a restore that is never followed by a cell costs no fork."""
        self.close()
        self.cells, self._source = list(snapshot.cells), snapshot


def start_template(user: str | None = "nobody") -> int:
    """Start this process's template (zygote) now rather than at the first cell; returns its pid. It lives
    until this process exits: leak checks should take their baseline after calling this."""
    return _Zygote.get(user).proc.pid


def sandbox_processes() -> list[int]:
    """Pids of every live sandbox process of this host process (the template's descendants)."""
    z = _Zygote._instance
    if z is None or z.owner != os.getpid() or z.proc.poll() is not None:
        return []
    from trace_gym.checker import descendant_pids

    return sorted(descendant_pids(z.proc.pid))


if __name__ == "__main__":
    _zygote_main(int(sys.argv[1]))
