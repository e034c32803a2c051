"""Directory trees a cell made, handled by file descriptor: copied, digested and removed without following a
link, without recursion and within a budget.

Used on both sides (the sandbox imports it by its bare name). Every name is resolved relative to a directory
descriptor with ``O_NOFOLLOW``, so a process that swaps a directory for a symbolic link mid-walk makes the walk
fail, never reach outside the tree. Removal has no depth limit: a subtree deeper than ``MAX_DEPTH`` is renamed
up to the top (by descriptor, same file system) and removed from there, so a 3,000-deep chain costs 3,000
renames, not 3,000 open descriptors or stack frames.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
import uuid

MAX_DEPTH = 64  # open directory descriptors held at once by a walk
MAX_ENTRIES = 10_000  # entries a snapshot may copy or digest; past it the snapshot is replay-only
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeTooLarge(OSError):
    """The tree is deeper than MAX_DEPTH or holds more than MAX_ENTRIES entries."""


def open_dir(name: str, dir_fd: int | None = None) -> int:
    """A descriptor of the directory ``name`` (relative to ``dir_fd``), refusing a symbolic link."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def make_dir(parent_fd: int, name: str, mode: int = 0o700) -> int:
    """Create ``name`` in ``parent_fd`` and return a descriptor of the directory created (not of a link)."""
    os.mkdir(name, mode, dir_fd=parent_fd)
    return open_dir(name, parent_fd)


def _entries(fd: int) -> list[tuple[str, os.stat_result]]:
    out = []
    for name in sorted(os.listdir(fd)):
        with contextlib.suppress(FileNotFoundError):
            out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
    return out


def walk(fd: int):
    """Yield (relative path, name, parent descriptor, lstat) for every entry below ``fd``, parents first, in
    sorted order. Raises TreeTooLarge past the limits."""
    stack: list[tuple[int, str, list[tuple[str, os.stat_result]]]] = [(fd, "", _entries(fd))]
    seen = 0
    try:
        while stack:
            top, prefix, todo = stack[-1]
            if not todo:
                stack.pop()
                if top != fd:
                    os.close(top)
                continue
            name, st = todo.pop(0)
            seen += 1
            if seen > MAX_ENTRIES:
                raise TreeTooLarge(0, f"more than {MAX_ENTRIES} entries")
            path = prefix + name
            yield path, name, top, st
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise TreeTooLarge(0, f"deeper than {MAX_DEPTH} levels")
                child = open_dir(name, top)
                stack.append((child, path + "/", _entries(child)))
    finally:
        for top, _, _ in stack:
            if top != fd:
                os.close(top)


def _read(name: str, dir_fd: int) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, f"{name!r} is no longer a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def digest(fd: int) -> str:
    """A digest of what ``copy`` keeps of the tree below ``fd``: names, kinds, permission bits, file contents
    and link targets. Raises OSError (TreeTooLarge among them) if it cannot."""
    h = hashlib.sha256()
    for path, name, parent, st in walk(fd):
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            body = _read(name, parent)
            h.update(f"f {path!r} {mode:o} {len(body)}\n".encode())
            h.update(hashlib.sha256(body).digest())
        elif stat.S_ISLNK(st.st_mode):
            h.update(f"l {path!r} {os.readlink(name, dir_fd=parent)!r}\n".encode())
        elif stat.S_ISDIR(st.st_mode):
            h.update(f"d {path!r} {mode:o}\n".encode())
    return h.hexdigest()


def copy(src_fd: int, dst_fd: int) -> None:
    """Copy the tree below ``src_fd`` into the (empty) directory ``dst_fd``: directories, regular files and
    symbolic links, with their permission bits; special files (pipes, sockets) are left out."""
    made: dict[str, int] = {"": dst_fd}
    try:
        for path, name, parent, st in walk(src_fd):
            target = made[path[: len(path) - len(name)]]
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                made[path + "/"] = make_dir(target, name, 0o700)
                os.chmod(made[path + "/"], mode)
            elif stat.S_ISREG(st.st_mode):
                body = _read(name, parent)
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=target)
                try:
                    view = memoryview(body)
                    while view:
                        view = view[os.write(out, view):]
                    os.fchmod(out, mode)
                finally:
                    os.close(out)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=parent), name, dir_fd=target)
    finally:
        for key, fd in made.items():
            if key:
                os.close(fd)


def remove(parent_fd: int, name: str, budget: int = 1_000_000, deadline: float | None = None) -> bool:
    """Remove ``name`` (a file, a link or a whole tree) from ``parent_fd``; True once it is gone.

    Never follows a link and never recurses; at most ``budget`` entries are removed, and none after
    ``deadline`` (``time.monotonic()``): False then, with the rest left in place. A subtree below MAX_DEPTH is
    renamed into ``parent_fd`` and removed from there."""
    roots = [name]
    while roots:
        root = roots.pop()
        try:
            st = os.stat(root, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        try:
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(root, dir_fd=parent_fd)
                budget -= 1
                continue
            stack = [(parent_fd, root, open_dir(root, parent_fd))]
        except FileNotFoundError:
            continue
        except OSError:
            return False
        try:
            while stack:
                up, here, fd = stack[-1]
                descended = False
                for child, cst in _entries(fd):
                    budget -= 1
                    if budget < 0 or (deadline is not None and time.monotonic() > deadline):
                        return False
                    if not stat.S_ISDIR(cst.st_mode):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(child, dir_fd=fd)
                    elif len(stack) < MAX_DEPTH:
                        stack.append((fd, child, open_dir(child, fd)))
                        descended = True
                        break
                    else:  # too deep to hold open: move the subtree to the top and remove it from there
                        moved = f".rm-{uuid.uuid4().hex}"
                        os.rename(child, moved, src_dir_fd=fd, dst_dir_fd=parent_fd)
                        roots.append(moved)
                if descended:
                    continue
                stack.pop()
                os.close(fd)
                os.rmdir(here, dir_fd=up)
        except OSError:
            return False
        finally:
            for _, _, fd in stack:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return True
