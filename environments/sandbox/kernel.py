"""The few Linux calls the sandbox makes itself, through libc (Python 3.11 has no ``os.unshare``).

Runs inside the template only, loaded before the audit hook forbids new C libraries. Everything else (the
template's jail, the seccomp program) comes from bubblewrap and libseccomp; see ``jail.py``.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl = _libc.prctl  # bound here: a cell may rebind the library object's attribute, not this name of a pinned copy
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
LINEAGE_NAMESPACES = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWUTS

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 0x1000, 0x2000, 0x4000, 0x40000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP = 1, 4, 22
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER, _PR_SET_KEEPCAPS = 38, 36, 8
CAP_SETGID, CAP_SETUID = 6, 7
_SECCOMP_MODE_FILTER = 2
_CAP_V3 = 0x20080522


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int = 0) -> None:
    _check(_prctl(option, arg, 0, 0, 0), f"prctl({option})")


def set_pdeathsig(sig: int) -> None:
    prctl(_PR_SET_PDEATHSIG, sig)


def set_subreaper() -> None:
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def set_dumpable(on: bool) -> None:
    prctl(_PR_SET_DUMPABLE, int(on))


def set_keepcaps(on: bool) -> None:
    prctl(_PR_SET_KEEPCAPS, int(on))


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def map_ids(pid: int, inside_uid: int, inside_gid: int, outside: int) -> None:
    """Map the ids of ``pid``'s new user namespace to the host uid and gid ``outside`` (from a process with
    CAP_SETUID and CAP_SETGID in the parent namespace: the template)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{inside_uid} {outside} 1"),
                       ("gid_map", f"{inside_gid} {outside} 1")):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)


def map_self(uid: int, gid: int) -> None:
    """After ``unshare(CLONE_NEWUSER)``: keep the same ids inside (the only mapping an unprivileged process may
    write for itself)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _capset_number() -> int:
    machine = os.uname().machine
    return {"x86_64": 126, "aarch64": 91}.get(machine, -1)


def drop_capabilities() -> None:
    """Empty the effective, permitted and inheritable sets (ambient follows): no way back without an exec of a
    privileged file, which no_new_privs forbids."""
    keep_capabilities(())


def keep_capabilities(caps: tuple[int, ...]) -> None:
    """Keep exactly ``caps`` (numbers below 32) effective and permitted, nothing inheritable."""
    number = _capset_number()
    if number < 0:
        raise OSError(0, f"capset: unknown system call number on {os.uname().machine}")
    data = (_CapData * 2)()
    for cap in caps:
        data[0].effective |= 1 << cap
        data[0].permitted |= 1 << cap
    _check(int(_libc.syscall(number, ctypes.byref(_CapHeader(_CAP_V3, 0)), data)), "capset")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program: bytes) -> None:
    """Install a classic-BPF seccomp program (libseccomp's export) on this process and its future children."""
    if not program or len(program) % 8:
        raise OSError(0, "seccomp: expected a BPF program of 8-byte instructions")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp")


def threads_of_self() -> int:
    """Threads of this process (a thread a cell started and left running counts)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1
