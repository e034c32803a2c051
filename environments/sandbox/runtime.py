"""The sandbox side of ``sandbox.py``: the template, each lineage's supervisor, workers, cells, frozen forks.

Started by the host as ``python -I runtime.py <fd>`` (inside bubblewrap unless isolation is "none"); it
imports its sibling modules by bare name and never imports the host package. Processes (each arrow a fork):

    template ──lineage──> Z ──> supervisor S (pid 1 of new namespaces) ──> worker W ──cell──> C (becomes W)
                                                                            └──snapshot──> frozen F ──spawn──> W'

Model code runs only in cells (C and what C becomes); the template, Z and S never run it, so the host may
trust what they send. Nothing a worker, a cell or a frozen fork sends is trusted.
"""

from __future__ import annotations

import _socket
import ast
import base64
import builtins
import contextlib
import gc
import os
import random
import resource
import signal
import socket
import sys
import time
import traceback
import types
from typing import Any, cast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `python -I` leaves the script's folder out
import dirtree
import kernel
import wire

# Every function below looks builtins up in this copy, taken before any cell runs: a cell that rebinds
# builtins.isinstance or builtins.__import__ does not reach the runtime's own steps (_pin_references does the
# same for the modules it calls). Cells get the real builtins module.
globals()["__builtins__"] = _BUILTINS = dict(vars(builtins))
# The C methods and functions themselves: a cell may rebind socket.socket's Python methods or sys.setprofile.
_close_socket, _detach_socket = _socket.socket.close, _socket.socket.detach
_getprofile, _gettrace, _setprofile, _settrace = sys.getprofile, sys.gettrace, sys.setprofile, sys.settrace

_PRELOAD = ("math", "cmath", "fractions", "itertools", "functools", "collections", "decimal", "statistics",
            "random", "re", "numpy", "sympy")
# Imported by the template but not bound in the namespace: after the switch to an unprivileged user the
# interpreter's own files may be unreadable (isolation "none" with a Python under /root), so a cell's
# `import heapq` must be cached.
_WARM = ("resource", "traceback", "linecache", "tokenize", "ctypes", "heapq", "bisect", "string", "operator",
         "datetime", "json", "copy", "numbers", "typing", "dataclasses", "textwrap", "time", "calendar", "array",
         "struct", "hashlib", "base64", "pprint", "enum", "io", "warnings", "secrets", "unicodedata", "csv",
         "threading", "numpy.linalg", "numpy.random", "numpy.polynomial", "numpy.fft", "sympy.ntheory",
         "sympy.solvers", "sympy.parsing.sympy_parser", "mpmath")
_THREAD_NOTE = ("\n[the cell left {n} threads running; a thread may not outlive its cell, so the cell's changes "
                "were discarded: join your threads before the cell ends]")


def _pinned(module: types.ModuleType) -> types.SimpleNamespace:
    """``module``'s names as they are now, its functions made again over a private copy of its globals in which
    the modules it uses are copies of their names too: rebinding a name in ``module``, or in a module it uses,
    reaches none of them. What they reach through objects (a class's methods, a library handle) stays shared."""
    own = {name: types.SimpleNamespace(**vars(value)) if isinstance(value, types.ModuleType) else value
           for name, value in vars(module).items()}
    own["__builtins__"] = _BUILTINS
    for name, value in list(own.items()):
        if isinstance(value, types.FunctionType) and value.__globals__ is vars(module):
            fn = types.FunctionType(value.__code__, own, value.__name__, value.__defaults__, value.__closure__)
            fn.__kwdefaults__, fn.__qualname__ = value.__kwdefaults__, value.__qualname__
            fn.__dict__.update(value.__dict__)
            own[name] = fn
    return types.SimpleNamespace(**own)


def _pin_references() -> None:
    """Once in the template, before any cell: every module this one calls (wire, os, signal, socket, ...) is
    replaced by its ``_pinned`` copy, so a cell that rebinds ``wire.send`` or ``os.fork`` does not reach the steps
    a worker takes after the cell's reply. Not a boundary (a cell can rebind this module's own names, or patch
    memory with ctypes); the sweep before the next cell is (docs/sandbox.md)."""
    _BUILTINS.update(vars(builtins))  # what the template's imports added
    g = globals()
    for name, value in list(g.items()):
        if isinstance(value, types.ModuleType) and value is not sys and value is not builtins:
            g[name] = _pinned(value)


class _Config:
    """Set once from the host's init message, before any lineage exists."""

    namespaces = True
    seccomp: bytes = b""
    kept: tuple[str, ...] = ()  # bound folders under /tmp or /dev/shm, which each lineage covers with its own
    lineage_ids = False  # each lineage gets its own host uid (as root): the template maps or switches to it


# --------------------------------------------------------------------------- cells
class _Capture:
    """sys.stdout/sys.stderr for a cell: keeps the first ``limit`` characters, counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.kept, self.dropped = limit, list[str](), 0, 0
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
    """The audit-hook tripwire: clear errors for the obvious attempts while model code runs.

    Not a boundary (model code can turn it off, and C code never reaches it); the kernel layers are."""

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
            return True
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
            if event in ("os.kill", "os.killpg") and args and args[0] == 0:
                return
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


def _execute(code: str, namespace: dict[str, Any], limits: dict[str, Any]) -> tuple[str, str]:
    """Run a cell notebook-style in ``namespace``; returns (output, status)."""
    cap = _Capture(int(limits["max_output_chars"]))
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = cap
    status = "ok"
    _Guard.untrusted = True
    try:
        tree = cast(ast.Module, compile(code, "<cell>", "exec", ast.PyCF_ONLY_AST))  # ast.parse, without its globals
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<cell>", "exec"), namespace)
        if isinstance(last, ast.Expr):
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


_RLIMIT_KEYS = ("cpu_s", "memory_bytes", "file_bytes", "processes", "open_files")


def _rlimits(limits: Any) -> tuple[Any, ...] | None:
    """The part of a cell's limits that ``_set_limits`` applies (None if ``limits`` is not a mapping)."""
    return tuple(limits.get(k) for k in _RLIMIT_KEYS) if isinstance(limits, dict) else None


def _set_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits.get("cpu_s", 10))
    for name, value in ((resource.RLIMIT_CPU, (cpu, cpu + 2)),
                        (resource.RLIMIT_AS, int(limits.get("memory_bytes", 2 << 30))),
                        (resource.RLIMIT_FSIZE, int(limits.get("file_bytes", 16 << 20))),
                        (resource.RLIMIT_NPROC, int(limits.get("processes", 64))),
                        (resource.RLIMIT_NOFILE, int(limits.get("open_files", 256))),
                        # queued signals and POSIX message queue bytes are counted per user across every
                        # lineage of the sandbox user: keep one lineage's share small
                        (resource.RLIMIT_SIGPENDING, 256), (resource.RLIMIT_MSGQUEUE, 0),
                        (resource.RLIMIT_CORE, 0)):
        soft, hard = value if isinstance(value, tuple) else (value, value)
        _, current = resource.getrlimit(name)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        try:  # noqa: SIM105 - contextlib.suppress runs a class's methods, which a cell can rebind
            resource.setrlimit(name, (soft, hard))
        except (ValueError, OSError):
            pass


def _reap_zombies() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


# --------------------------------------------------------------------------- workers and frozen forks
class _Runtime:
    """The loop of a sandbox process: a worker (``serve``) or a frozen fork (``freeze``)."""

    def __init__(self, namespace: dict[str, Any]):
        self.ns = namespace
        self.standby: tuple[int, socket.socket] | None = None  # (pid, channel) of the next cell's process
        self.between: tuple[Any, Any, bool, dict | None] = (None, None, True, None)  # what _quiet set aside

    def fork(self) -> int:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a cell may have tampered with it
        state = random.getstate()
        pid = os.fork()
        if pid == 0:
            random.setstate(state)  # `random` reseeds after fork; forks must continue the same stream
        return pid

    def serve(self, sock: socket.socket) -> None:
        """Answer the host's requests on ``sock`` until it closes. Never returns."""
        while True:
            # No handler a cell installed runs here between cells (nor in the standby cell process, which would
            # then miss its effects): signals wait, and a cell process unblocks them for its own run.
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            # children a cell left are killed by the supervisor's sweep when the cell ends: reap them
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            _reap_zombies()
            fds: list[int] = []
            msg = wire.recv(sock, None, fds)
            if msg is None or msg.get("op") == "close":
                os._exit(0)
            op = msg.get("op")
            if op == "exec":
                sock = self._exec(sock, str(msg.get("code", "")), msg.get("limits", {}))
            elif op == "prefork":
                sock = self._prefork(sock, msg.get("limits", {}))  # no reply: the host does not wait for it
            elif op == "snapshot" and fds:
                self._snapshot(sock, socket.socket(fileno=fds[0]), str(msg.get("dir")))
            else:
                for fd in fds:
                    os.close(fd)
                wire.send(sock, {"error": f"unknown request {op!r}"})

    def _prefork(self, host: socket.socket, limits: dict[str, Any]) -> socket.socket:
        """Fork the next cell's process now, while the host is busy elsewhere, so that a cell does not wait for
        the fork of this interpreter. The host asks only once the sweep after the previous cell is done (that
        sweep kills every descendant of this worker). A fork refused here is tried again by the cell."""
        if self.standby is not None:
            wire.send(host, {"standby": False})
            return host
        mine, theirs = socket.socketpair()
        try:
            pid = self.fork()
        except OSError:
            _close_socket(mine)
            _close_socket(theirs)
            wire.send(host, {"standby": False})  # the host reads one word after each prefork
            return host
        if pid == 0:  # the standby: waits for its cell, holding this worker's state
            _close_socket(mine)
            # Stamped by the kernel with this process's pid: the host spares it (and only it, a child of the
            # worker) in the sweep before the next cell, which kills whatever else the worker started meanwhile.
            try:
                wire.send(host, {"standby": True})
            except OSError:  # the host is gone
                os._exit(0)
            os.close(_detach_socket(host))
            os.setpgid(0, 0)
            kernel.set_pdeathsig(signal.SIGKILL)
            _set_limits(limits)  # the cell's limits, set ahead too (set again if the cell brings others)
            # A cell of no effect, in a namespace of its own: the pages any cell's run writes are copied now,
            # not while the cell waits.
            _execute("None", {"__builtins__": builtins}, limits)
            request = wire.recv(theirs, None)
            if request is None:
                os._exit(0)
            cell_limits = request.get("limits", {})
            return self._cell(theirs, str(request.get("code", "")), cell_limits,
                              set_limits=_rlimits(cell_limits) != _rlimits(limits))
        _close_socket(theirs)
        self.standby = (pid, mine)
        return host

    def _exec(self, host: socket.socket, code: str, limits: dict[str, Any]) -> socket.socket:
        pid, mine = self._take_standby(code, limits)
        if pid == 0:  # no standby could take the cell: fork its process now
            mine, theirs = socket.socketpair()
            try:
                pid = self.fork()
            except OSError as exc:  # the lineage's process limit (a cell's children may hold it): this worker stays
                mine.close()
                theirs.close()
                wire.send(host, {"output": f"Crashed: the cell could not start ({exc.strerror}: the lineage's "
                                           "process limit); earlier state is intact.", "status": "crashed",
                                 "committed": False})
                return host
            if pid == 0:  # the cell child
                mine.close()
                os.close(host.detach())  # the cell gets the host channel back only if it finishes
                os.setpgid(0, 0)
                kernel.set_pdeathsig(signal.SIGKILL)
                return self._cell(theirs, code, limits)
            theirs.close()
        assert mine is not None  # a standby that took the cell handed over its channel
        deadline = time.monotonic() + float(limits.get("timeout_s", 10.0))
        result = wire.recv(mine, deadline)
        threads = result.get("threads", 1) if result is not None else 1
        if result is not None and threads == 1:
            output = result.get("output")
            status = "error" if result.get("status") == "error" else "ok"
            wire.send(mine, {"commit": True, "output": output if isinstance(output, str) else "", "status": status},
                      [host.fileno()])
            # The child holds the new state and the host channel, and may have answered the host already: this
            # process never answers again. Without the child's word that it took over, it is killed.
            if wire.recv(mine, time.monotonic() + 10.0) is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            os._exit(0)
        timed_out = result is None and time.monotonic() >= deadline
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        _, wstatus = os.waitpid(pid, 0)
        mine.close()
        if result is not None and threads != 1:
            output = result.get("output")
            text = (output if isinstance(output, str) else "") + _THREAD_NOTE.format(n=int(threads) - 1
                                                                                  if isinstance(threads, int) else "")
            wire.send(host, {"output": text, "status": "error", "committed": False})
            return host
        if timed_out:
            text, kind = f"Timeout: the cell ran longer than {limits.get('timeout_s')} s and was killed.", "timeout"
        elif os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            reason = {"SIGXCPU": "CPU time limit exceeded", "SIGKILL": "killed (CPU or memory limit)",
                      "SIGSEGV": "segmentation fault", "SIGXFSZ": "file size limit exceeded"}.get(name, name)
            text, kind = f"Crashed: the cell's process died ({reason}).", "crashed"
        else:
            text, kind = f"Crashed: the cell exited with status {os.waitstatus_to_exitcode(wstatus)}.", "crashed"
        wire.send(host, {"output": text + " Its changes were discarded; earlier state is intact.", "status": kind,
                         "committed": False})
        return host

    def _take_standby(self, code: str, limits: dict[str, Any]) -> tuple[int, socket.socket | None]:
        """Hand the cell to the standby process; (0, None) if there is none or it is gone."""
        if self.standby is None:
            return 0, None
        pid, mine = self.standby
        self.standby = None
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # from here its exit status is ours to read
        try:
            os.waitpid(pid, os.WNOHANG)  # raises if it was reaped while this worker ignored SIGCHLD
            wire.send(mine, {"code": code, "limits": limits})  # it waits in recv: read at once
            return pid, mine
        except OSError:
            mine.close()
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            return 0, None

    def _cell(self, theirs: socket.socket, code: str, limits: dict[str, Any], set_limits: bool = True) -> socket.socket:
        """In the cell's own process: run ``code`` under the cell's limits, report to the worker on ``theirs``,
        and, if told to commit, become the worker; returns the host channel it then serves."""
        if set_limits:
            _set_limits(limits)
        self._wake()
        signal.pthread_sigmask(signal.SIG_SETMASK, set())  # the cell's own handlers run in its own process
        output, status = _execute(code, self.ns, limits)
        self._quiet()
        with contextlib.suppress(OSError):
            wire.send(theirs, {"output": output, "status": status, "threads": kernel.threads_of_self()})
        fds: list[int] = []
        commit = wire.recv(theirs, None, fds)
        if commit is None or not fds:
            os._exit(0)
        kernel.set_pdeathsig(0)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))  # room for the worker's own bookkeeping
        new_host = socket.socket(fileno=fds[0])
        # This process is the worker now: it answers (so the kernel stamps the reply with its pid), and only then
        # tells the old worker, whose exit would otherwise delay the answer.
        wire.send(new_host, {"output": str(commit.get("output", "")), "status": str(commit.get("status")),
                             "committed": True})
        wire.send(theirs, {"ack": True})
        _close_socket(theirs)
        return new_host

    def _quiet(self) -> None:
        """Right after a cell's code, before its reply: signals wait; the profile and trace hooks the cell set, the
        cyclic garbage collector (which runs finalizers and weakref callbacks) and the builtins it rebound are
        set aside until the next cell's code, so that none of them runs model code in this process after its
        reply (the library code the runtime calls sees the builtins as they were before any cell). ``_wake`` puts
        them back."""
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        table = vars(builtins)
        rebound = None
        if table != _BUILTINS:
            rebound = dict(table)
            table.clear()
            table.update(_BUILTINS)
        self.between = (_getprofile(), _gettrace(), gc.isenabled(), rebound)
        _setprofile(None)
        _settrace(None)
        gc.disable()

    def _wake(self) -> None:
        profile, trace, collect, rebound = self.between
        if rebound is not None:
            table = vars(builtins)
            table.clear()
            table.update(rebound)
        if collect:
            gc.enable()
        _setprofile(profile)
        _settrace(trace)

    def _snapshot(self, host: socket.socket, channel: socket.socket, directory: str) -> None:
        try:
            _copy_into(".", directory)
        except OSError as exc:  # too deep, too many entries, the lineage's disk full: the host replays instead
            channel.close()
            wire.send(host, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            return
        try:
            pid = self.fork()
        except OSError as exc:
            channel.close()
            wire.send(host, {"ok": False, "error": f"fork: {exc.strerror}"})
            return
        if pid == 0:
            host.close()
            self._drop_standby()  # the worker's, not this process's child
            os.setpgid(0, 0)
            wire.send(channel, {"frozen": True})  # stamped by the kernel with this process's pid
            self.freeze(channel, directory)
        channel.close()
        wire.send(host, {"ok": True})

    def _drop_standby(self) -> None:
        if self.standby is not None:
            self.standby[1].close()
            self.standby = None

    def freeze(self, sock: socket.socket, directory: str) -> None:
        """Serve spawn requests: each forks a worker holding this process's state. Never returns."""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # spawned workers are reaped automatically
        while True:
            fds: list[int] = []
            msg = wire.recv(sock, None, fds)
            if msg is None or msg.get("op") != "spawn" or not fds:
                os._exit(0)
            try:
                pid = self.fork()
            except OSError:  # the host falls back to replay; this snapshot stays for the next restore
                os.close(fds[0])
                continue
            if pid != 0:
                signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # fork() reset it; keep reaping
                _reap_zombies()
                os.close(fds[0])
                continue
            sock.close()
            channel = socket.socket(fileno=fds[0])
            workdir = str(msg.get("workdir"))
            try:
                _copy_into(directory, workdir)
            except OSError:
                os._exit(1)  # the host falls back to replay
            os.chdir(workdir)
            _Guard.workdir = os.path.realpath(workdir)
            wire.send(channel, {"ready": True})
            self.serve(channel)


def _copy_into(source: str, target: str) -> None:
    """Copy the tree at ``source`` into the new directory ``target`` (whose parent is the lineage's folder)."""
    src = dirtree.open_dir(source)
    parent = dirtree.open_dir(os.path.dirname(target))
    try:
        dst = dirtree.make_dir(parent, os.path.basename(target))
        try:
            dirtree.copy(src, dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
        os.close(parent)


# --------------------------------------------------------------------------- lineages
_INODES = 32768  # files a lineage may hold at once (tmpfs inodes cost kernel memory outside the size limit)


_PTYS = 8  # ptys a lineage may hold at once: the host's pool (kernel.pty.max) is shared by every devpts instance


def _lineage_mounts(lineage_dir: str, disk_bytes: int) -> None:
    """In the lineage's new mount namespace: its own /proc and devpts, and at ``lineage_dir`` a tmpfs of
    ``disk_bytes`` that also holds /tmp and /dev/shm: one quota for every file the lineage writes, gone with the
    lineage's last process. No host folder is writable here."""
    kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
    hidden = kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC
    kernel.mount("proc", "/proc", "proc", hidden)
    # bubblewrap's /dev has one devpts instance for the whole jail; each lineage gets its own, of _PTYS
    kernel.mount("devpts", "/dev/pts", "devpts", kernel.MS_NOSUID | kernel.MS_NOEXEC,
                 f"newinstance,ptmxmode=0666,max={_PTYS}")
    if not os.path.islink("/dev/ptmx"):
        kernel.mount("/dev/pts/ptmx", "/dev/ptmx", None, kernel.MS_BIND)
    kernel.mount("tmpfs", lineage_dir, "tmpfs", hidden, f"size={disk_bytes},nr_inodes={_INODES},mode=0700")
    # What the jail binds under /tmp or /dev/shm (a Python or a project in the system's temporary folder) would
    # be hidden by the lineage's own folders: each is bound aside first and put back on top of them below.
    aside = []
    for i, path in enumerate(_Config.kept):
        spot = os.path.join(lineage_dir, f".kept-{i}")
        os.mkdir(spot, 0o700)
        kernel.mount(path, spot, None, kernel.MS_BIND | kernel.MS_REC)
        aside.append((spot, path))
    for name, target in ((".tmp", "/tmp"), (".shm", "/dev/shm")):
        os.mkdir(os.path.join(lineage_dir, name))
        os.chmod(os.path.join(lineage_dir, name), 0o1777)
        kernel.mount(os.path.join(lineage_dir, name), target, None, kernel.MS_BIND)
        _put_back(target, [(spot, path) for spot, path in aside if path.startswith(target + os.sep)])


def _put_back(target: str, aside: list[tuple[str, str]]) -> None:
    """Move the binds set aside back to their paths under ``target``, in a read-only skeleton: a small tmpfs
    at each top folder (a mount point cannot be renamed, a read-only one not changed), so no cell can swap what
    another process of the lineage imports from there."""
    tops = sorted({os.path.join(target, os.path.relpath(path, target).split(os.sep)[0]) for _, path in aside})
    hidden = kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC
    for top in tops:
        os.mkdir(top, 0o755)
        below = [(spot, path) for spot, path in aside if path == top or path.startswith(top + os.sep)]
        skeleton = any(path != top for _, path in below)
        if skeleton:
            kernel.mount("tmpfs", top, "tmpfs", hidden, "size=64k,nr_inodes=256,mode=0755")
        for spot, path in below:
            if path != top:
                os.makedirs(path, 0o755, exist_ok=True)
            kernel.mount(spot, path, None, kernel.MS_MOVE)
            os.rmdir(spot)
        if skeleton:
            kernel.mount(None, top, None, kernel.MS_REMOUNT | kernel.MS_RDONLY | hidden)


def _living(namespaces: bool, me: int) -> dict[int, int]:
    """pid -> parent pid of this lineage's live (non-zombie) processes other than the supervisor."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] not in ("Z", "X"):
            parents[int(name)] = int(fields[1])
    if not namespaces:  # no PID namespace: the lineage is this subreaper's descendants
        found, frontier = set[int](), {me}
        while frontier:
            frontier = {p for p, pp in parents.items() if pp in frontier} - found
            found |= frontier
        parents = {p: pp for p, pp in parents.items() if p in found}
    parents.pop(me, None)
    return parents


def _pidfd_pid(fd: int) -> int:
    """The pid (in this namespace) of the process a pidfd refers to; 0 if not visible here or gone."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    return max(0, int(line.split()[1]))
    except (OSError, ValueError):
        pass
    return 0


def _sweep(namespaces: bool, workers: set[int], alone: set[int]) -> None:
    """Kill every process of the lineage but the supervisor, the processes in ``alone`` (frozen forks, a
    worker whose cell just ended) and the workers in ``workers`` with their descendants (a cell in flight)."""
    me = os.getpid()
    for _ in range(1000):  # a fork bomb may add processes while we kill; RLIMIT_NPROC bounds it
        parents = _living(namespaces, me)
        keep, frontier = set(alone), set(workers)
        while frontier:
            keep |= frontier
            frontier = {p for p, pp in parents.items() if pp in frontier} - keep
        doomed = [p for p in parents if p not in keep]
        if not doomed:
            return
        exits = []
        for p in doomed:
            with contextlib.suppress(OSError):
                exits.append(os.pidfd_open(p))
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        _wait_exits(exits, time.monotonic() + 0.05)  # then look again: one may have forked before its kill


def _wait_exits(pidfds: list[int], deadline: float) -> None:
    """Wait until every process behind ``pidfds`` has exited (a pidfd turns readable), or ``deadline``; closes them."""
    import select

    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    left = set(pidfds)
    try:
        while left and (wait := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(max(1, int(wait * 1000))):
                poller.unregister(fd)
                left.discard(fd)
    finally:
        for fd in pidfds:
            os.close(fd)


def _own_name(name: Any) -> str | None:
    """``name`` if it names a working or snapshot directory of the lineage (a plain name, nothing else)."""
    if isinstance(name, str) and name[:2] in ("w-", "s-") and name[2:].isdigit():
        return name
    return None


def _supervise(ctl: socket.socket, namespaces: bool, lineage: int) -> None:
    """The lineage's supervisor loop: sweep, remove a directory or digest one on request, end everything when
    the host hangs up. ``lineage`` is a descriptor of the lineage's folder."""
    while True:
        fds: list[int] = []
        msg = wire.recv(ctl, None, fds)
        if msg is None:
            _sweep(namespaces, set(), set())
            os._exit(0)  # as pid 1 of the lineage's namespace, this also kills what the sweep missed
        if msg.get("op") == "digest":
            name, value = _own_name(msg.get("name")), None
            if name is not None:
                with contextlib.suppress(OSError):
                    fd = dirtree.open_dir(name, lineage)
                    try:
                        value = dirtree.digest(fd)
                    finally:
                        os.close(fd)
            wire.send(ctl, {"digest": value})
            continue
        kinds = msg.get("kinds") if isinstance(msg.get("kinds"), list) else []
        workers, alone = set[int](), set[int]()
        for fd, kind in zip(fds, kinds):
            pid = _pidfd_pid(fd)
            if pid:
                (workers if kind == "worker" else alone).add(pid)
        for fd in fds:
            os.close(fd)
        _sweep(namespaces, workers, alone)
        for name in msg.get("remove") or []:
            if _own_name(name) is not None:  # within the host's deadline; the rest goes with the lineage
                dirtree.remove(lineage, name, deadline=time.monotonic() + 5.0)
        wire.send(ctl, {"swept": True})


def _lineage_uid(msg: dict[str, Any]) -> int | None:
    uid = msg.get("uid")
    return uid if _Config.lineage_ids and isinstance(uid, int) and uid > 0 else None


def _new_lineage(runtime: _Runtime, msg: dict[str, Any], ctl: socket.socket, chan: socket.socket,
                 handshake: tuple[int, int] | None) -> None:
    """In a fork of the template (trusted: model code never ran here). Creates the lineage's namespaces, forks
    the supervisor into them and hands the host a pidfd of it; the supervisor forks the first worker.

    With its own host uid (``handshake``: tell the template, wait for it) the lineage's user namespace maps the
    sandbox user's ids to it; without namespaces this process switches to it."""
    namespaces, own = _Config.namespaces, _lineage_uid(msg)
    try:
        if namespaces:
            kernel.set_dumpable(True)  # /proc/self/uid_map must be writable by this process after a uid switch
            uid, gid = os.getuid(), os.getgid()
            kernel.unshare(kernel.LINEAGE_NAMESPACES)
            if handshake is not None:
                ask, mapped = handshake
                os.write(ask, b"u")
                if os.read(mapped, 1) != b"m":
                    raise OSError(0, "the template did not map the lineage's ids")
                os.setresgid(gid, gid, gid)  # the same ids inside, now the lineage's own uid outside
                os.setresuid(uid, uid, uid)
            else:
                kernel.map_self(uid, gid)
        elif own is not None:
            os.setgroups([])
            os.setresgid(own, own, own)
            os.setresuid(own, own, own)
            kernel.drop_capabilities()  # a switch between two non-zero uids keeps them
        spid = runtime.fork()
        if spid == 0:
            _start_supervisor(runtime, msg, ctl, chan)
        pidfd = os.pidfd_open(spid)
        wire.send(ctl, {"ok": True}, [pidfd])
    except Exception as exc:
        with contextlib.suppress(OSError):
            wire.send(ctl, {"error": f"{type(exc).__name__}: {exc}"})
    os._exit(0)


def _start_supervisor(runtime: _Runtime, msg: dict[str, Any], ctl: socket.socket, chan: socket.socket) -> None:
    namespaces = _Config.namespaces
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN)  # pid 1 ignores what it has no handler for; none here
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # orphans of the lineage are reparented here: reap them
    try:
        lineage_dir = str(msg["dir"])
        if namespaces:
            _lineage_mounts(lineage_dir, int(msg["disk_bytes"]))
        else:
            kernel.set_subreaper()
        lineage = dirtree.open_dir(lineage_dir)
        os.close(dirtree.make_dir(lineage, os.path.basename(str(msg["workdir"]))))
        wpid = runtime.fork()
        if wpid == 0:
            ctl.close()
            os.close(lineage)
            _start_worker(runtime, chan, str(msg["workdir"]))
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    except Exception as exc:
        with contextlib.suppress(OSError):
            wire.send(chan, {"error": f"lineage setup failed: {type(exc).__name__}: {exc}"})
        os._exit(1)
    chan.close()
    _supervise(ctl, namespaces, lineage)


def _start_worker(runtime: _Runtime, chan: socket.socket, workdir: str) -> None:
    try:
        os.umask(0o077)
        if _Config.namespaces:
            kernel.drop_capabilities()  # the supervisor keeps its capabilities in the lineage's user namespace
        # Not dumpable: no process of the same user (a later cell) may open this worker's, or a frozen fork's,
        # /proc/PID/mem; forks inherit it, and the filter refuses to turn it back on.
        kernel.set_dumpable(False)
        if _Config.seccomp:
            kernel.load_seccomp(_Config.seccomp)
        os.chdir(workdir)
        _Guard.workdir = os.path.realpath(workdir)
    except Exception as exc:
        with contextlib.suppress(OSError):
            wire.send(chan, {"error": f"worker setup failed: {type(exc).__name__}: {exc}"})
        os._exit(1)
    wire.send(chan, {"ready": True})
    runtime.serve(chan)


# --------------------------------------------------------------------------- the template
def _configure(msg: dict[str, Any]) -> None:
    """Apply the host's init message: the layers on, and (as root) the switch to the sandbox user."""
    _Config.namespaces = bool(msg.get("namespaces"))
    _Config.seccomp = base64.b64decode(str(msg.get("seccomp", "")))
    _Config.kept = tuple(str(p) for p in msg.get("kept") or [])
    if os.geteuid() == 0:
        if msg.get("mount_proc"):  # as root, bubblewrap leaves /proc to us (see jail.py)
            kernel.mount("proc", "/proc", "proc", kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC)
        uid, gid = msg.get("uid"), msg.get("gid")
        if isinstance(uid, int) and isinstance(gid, int):
            _Config.lineage_ids = bool(msg.get("lineage_ids"))
            kernel.set_keepcaps(_Config.lineage_ids)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)  # clears every capability, or (keepcaps) the effective ones
            if _Config.lineage_ids:
                # Only what gives each lineage its own host uid: mapping its user namespace's ids (or, without
                # namespaces, switching to it). Model code never runs here, and no lineage can reach this
                # process (another uid, another PID namespace).
                kernel.set_keepcaps(False)
                kernel.keep_capabilities((kernel.CAP_SETUID, kernel.CAP_SETGID))
    if _Config.namespaces and not _Config.lineage_ids:
        kernel.drop_capabilities()  # with user=None the template keeps root's uid, never its capabilities


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _map_lineage(pid: int, own: int, asked: int, mapped: int) -> None:
    """Map the new user namespace of the lineage's first process ``pid`` to the host uid ``own``, once it has
    made it (it says so on ``asked``); it goes on when told so on ``mapped``, and fails if the pipe closes."""
    try:
        if wire.readable(asked, 10.0) and os.read(asked, 1) == b"u":
            with contextlib.suppress(OSError):
                kernel.map_ids(pid, os.getuid(), os.getgid(), own)
                os.write(mapped, b"m")
    finally:
        _close(asked)
        _close(mapped)


def main(fd: int) -> None:
    """Entry of the template process."""
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    host = socket.socket(fileno=fd)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
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
    _pin_references()
    gc.freeze()  # the template's objects are never collected: a collection in a fork would copy their pages
    init = wire.recv(host)
    if init is None:
        os._exit(1)
    try:
        _configure(init)
    except Exception as exc:
        wire.send(host, {"error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    sys.addaudithook(_Guard.hook)
    kernel.set_subreaper()  # supervisors (their Z parent exits at once) are reparented here and reaped
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1) if os.environ.get("TRACE_SANDBOX_DEBUG") else (0, 1, 2):
        os.dup2(devnull, target)  # C-level writes of a cell go nowhere
    runtime = _Runtime(namespace)
    wire.send(host, {"ready": True})
    while True:
        fds: list[int] = []
        msg = wire.recv(host, None, fds)
        if msg is None:
            os._exit(0)
        if msg.get("op") != "lineage" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        ctl, chan = socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])
        own = _lineage_uid(msg) if _Config.namespaces else None
        asked, mapped = (os.pipe(), os.pipe()) if own is not None else ((-1, -1), (-1, -1))
        pid = runtime.fork()
        if pid == 0:
            host.close()
            for fd in (asked[0], mapped[1]):
                _close(fd)
            _new_lineage(runtime, msg, ctl, chan, (asked[1], mapped[0]) if own is not None else None)
        for fd in (asked[1], mapped[0]):
            _close(fd)
        if own is not None:
            _map_lineage(pid, own, asked[0], mapped[1])
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        _reap_zombies()
        ctl.close()
        chan.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
