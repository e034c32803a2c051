"""Messages between the host and sandbox processes: length-prefixed JSON over Unix stream sockets.

Used on both sides (the sandbox imports it by its bare name). Never pickle: anything a sandbox process sends is
untrusted. File descriptors travel with ``SCM_RIGHTS``. On a socket with ``SO_PASSCRED`` (the host's ends), the
kernel attaches the pid of the process that wrote each frame (``SCM_CREDENTIALS``), translated into the reader's
PID namespace: the host learns which process it talks to from the kernel, not from what the process says.
"""

from __future__ import annotations

import array
import contextlib
import json
import math
import os
import select
import socket
import struct
import time
from typing import Any

MAX_MESSAGE = 8 << 20  # bytes; a larger frame from a sandbox process is treated as garbage
_UCRED = struct.Struct("iII")  # pid, uid, gid


def send(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None,
         deadline: float | None = None) -> None:
    """Write one message. With a ``deadline`` (``time.monotonic()`` seconds), a peer that stops reading makes it
    raise ``TimeoutError`` (an OSError) at the deadline instead of blocking: the host sends with one always."""
    data = json.dumps(obj).encode()
    frame = struct.pack("!I", len(data)) + data
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed before the message was sent")
        sock.settimeout(left)  # sendall's timeout bounds the whole call, not each chunk
    try:
        if fds:
            socket.send_fds(sock, [frame[:4]], fds)
            if deadline is not None:
                sock.settimeout(max(1e-3, deadline - time.monotonic()))
            sock.sendall(frame[4:])
        else:
            sock.sendall(frame)
    finally:
        if deadline is not None:
            sock.settimeout(None)


def passcred(sock: socket.socket) -> socket.socket:
    """Ask the kernel to stamp every frame read from ``sock`` with its writer's pid."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return sock


def readable(fd: int | socket.socket, timeout: float) -> bool:
    """True once ``fd`` is readable (or hung up) within ``timeout`` seconds. poll, not select: a trainer holding
    many snapshots has descriptors numbered past select's limit of 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


def _recv_exact(sock: socket.socket, n: int, deadline: float | None, fds: list[int] | None,
                writer: list[int] | None) -> bytes | None:
    buf = bytearray()
    anc = socket.CMSG_SPACE(16 * 4) + socket.CMSG_SPACE(_UCRED.size)
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not readable(sock, left):
                return None
        try:
            chunk, ancdata, _, _ = sock.recvmsg(n - len(buf), anc)
        except (OSError, ValueError):
            return None
        for level, kind, data in ancdata:
            if level != socket.SOL_SOCKET:
                continue
            if kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[: len(data) - len(data) % got.itemsize])
                if fds is None:  # not expected here: close rather than leak them
                    for fd in got:
                        _close(fd)
                else:
                    fds.extend(got)
            elif kind == socket.SCM_CREDENTIALS and writer is not None and not writer and len(data) >= _UCRED.size:
                writer.append(_UCRED.unpack(data[: _UCRED.size])[0])
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def recv(sock: socket.socket, deadline: float | None = None, fds: list[int] | None = None,
         writer: list[int] | None = None, limit: int = MAX_MESSAGE) -> dict[str, Any] | None:
    """One message, or None on EOF, timeout or garbage (a sandbox process may send anything).

    ``fds`` collects descriptors sent with the frame; ``writer`` receives the kernel-stamped pid of the process
    that wrote the frame's first bytes (only on a ``passcred`` socket; 0 if that process is not visible here).
    ``limit``: the largest frame accepted, in bytes."""
    head = _recv_exact(sock, 4, deadline, fds, writer)
    if head is None:
        return None
    (size,) = struct.unpack("!I", head)
    if size > limit:
        return None
    body = _recv_exact(sock, size, deadline, None, None)
    if body is None:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # ValueError includes an integer of more digits than int() reads
        return None
    return obj if isinstance(obj, dict) else None
