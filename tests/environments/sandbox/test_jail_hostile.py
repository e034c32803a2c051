"""The jail, tried as an attacker would: each probe's success would be detectable and harmless (a
listener, a process, a folder or a file the test owns), and must not happen. Every probe first switches the
audit-hook tripwire off from inside the cell, so what stops it is the kernel. After each probe the sandbox
still answers ``print(6*7)``, and once it is closed no sandbox process is left."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.environments.sandbox.leaks import settled, settled_at
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, sandbox_processes, start_template

LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=1 << 30, processes=32, max_output_chars=2000)
HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


@pytest.fixture(scope="module", autouse=True)
def template() -> None:
    start_template()  # lives as long as this process: the baseline of the leak checks




@pytest.fixture
def box() -> Iterator[PythonSandbox]:
    sandbox = PythonSandbox(LIMITS)
    sandbox.run("keep = 'still here'")
    yield sandbox
    assert sandbox.run("print(6*7)").output == "42\n"
    sandbox.close()
    assert settled() == []


@pytest.fixture
def victim() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    alive = proc.poll() is None
    proc.kill()
    proc.wait()
    assert alive, "a process the test owns was killed"


def run(box: PythonSandbox, code: str) -> str:
    return box.run(HOOK_OFF + code).output


# --------------------------------------------------------------------------- the host trusts no report
def test_host_never_kills_a_pid_the_worker_reports(box: PythonSandbox, victim: subprocess.Popen) -> None:
    # The released code SIGKILLed whatever pid a cell made the worker report. Lie every way a cell can:
    # os.getpid, and every frame the worker sends from now on carries the victim's pid (through the runtime's own
    # reference to wire.send: it binds its modules' functions before any cell, but its own names stay reachable).
    run(box, f"import os, sys\nos.getpid = lambda: {victim.pid}\nw = sys.modules['__main__'].wire\n_send = w.send\n"
             f"w.send = lambda s, o, fds=None: _send(s, dict(o, pid={victim.pid}, exiting={victim.pid}), fds)")
    box.run("x = 1")
    snap = box.snapshot()
    box.close()
    box.restore(snap)
    assert box.run("x").output == "1\n"
    box.reset()
    snap.release()
    assert victim.poll() is None


def test_a_cell_cannot_forge_its_sender_pid(box: PythonSandbox) -> None:
    # SCM_CREDENTIALS naming another pid needs CAP_SYS_ADMIN, which no worker has.
    out = run(box, "import os, socket, struct\na, b = socket.socketpair()\n"
                   "b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)\n"
                   "try:\n    a.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, "
                   "struct.pack('iII', 1, os.getuid(), os.getgid()))])\n    print('forged')\n"
                   "except OSError as e:\n    print(e.errno)")
    assert "forged" not in out


# --------------------------------------------------------------------------- network
@pytest.fixture
def listener() -> Iterator[tuple[int, list]]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list = []
    threading.Thread(target=lambda: _accept(server, accepted), daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.fixture
def abstract_listener() -> Iterator[tuple[str, list]]:
    name = f"trace-gym-probe-{uuid.uuid4().hex}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(8)
    accepted: list = []
    threading.Thread(target=lambda: _accept(server, accepted), daemon=True).start()
    yield name, accepted
    server.close()


def _accept(server: socket.socket, accepted: list) -> None:
    while True:
        try:
            accepted.append(server.accept())
        except OSError:
            return


def test_no_tcp_to_a_host_listener_even_through_raw_syscalls(box: PythonSandbox, listener) -> None:
    port, accepted = listener
    out = run(box, LIBC + "import struct, socket\n"
                   f"addr = struct.pack('!HH4s8x', 2, {port}, socket.inet_aton('127.0.0.1'))\n"
                   "addr = struct.pack('H', 2) + addr[2:]\n"
                   "fd = libc.socket(2, 1, 0)\nprint('socket', fd, ctypes.get_errno())\n"
                   "if fd >= 0:\n    print('connect', libc.connect(fd, addr, len(addr)), ctypes.get_errno())")
    time.sleep(0.2)
    assert accepted == [], out
    assert "socket -1 1" in out  # seccomp: EPERM for every socket()


def test_no_connection_to_a_host_abstract_socket(box: PythonSandbox, abstract_listener) -> None:
    name, accepted = abstract_listener
    out = run(box, f"import socket\ntry:\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0{name}')\n"
                   "    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)")
    time.sleep(0.2)
    assert accepted == [] and "connected" not in out


def test_each_sandbox_has_its_own_namespaces_unlike_the_host() -> None:
    kinds = ("net", "pid", "mnt", "ipc", "uts", "user")
    code = HOOK_OFF + f"import os\nprint(' '.join(os.readlink('/proc/self/ns/' + k) for k in {kinds!r}))"
    with PythonSandbox(LIMITS) as a, PythonSandbox(LIMITS) as b:
        seen_a, seen_b = a.run(code).output.split(), b.run(code).output.split()
    host = [os.readlink(f"/proc/self/ns/{k}") for k in kinds]
    assert len(seen_a) == len(kinds) == len(seen_b)
    for mine, other, theirs in zip(seen_a, seen_b, host):
        assert mine != theirs and mine != other
    assert settled() == []


# --------------------------------------------------------------------------- file system
def test_no_write_outside_the_working_directory(box: PythonSandbox, tmp_path) -> None:
    import sys

    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o777)
    venv_file = os.path.join(sys.prefix, f"pwned-{uuid.uuid4().hex}")
    root_file = f"/run/pwned-{uuid.uuid4().hex}"  # next to the lineage's own folder
    targets = [str(probe / "a"), venv_file, root_file, "/usr/pwned", "/etc/pwned"]
    out = run(box, LIBC + f"for path in {targets!r}:\n"
                   "    try:\n        fd = os.open(os.path.dirname(path), os.O_RDONLY)\n"
                   "        os.close(os.open(os.path.basename(path), os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"
                   "        print('wrote', path)\n    except OSError as e:\n        print(e.errno, path)\n"
                   "    libc.system(('touch ' + path).encode())\n")
    try:
        assert list(probe.iterdir()) == [] and not os.path.exists(venv_file), out
        assert not os.path.exists(root_file) and not os.path.exists("/usr/pwned") and not os.path.exists("/etc/pwned")
    finally:
        for path in (venv_file, root_file, "/usr/pwned", "/etc/pwned"):
            if os.path.exists(path):
                os.remove(path)


def test_one_sandbox_cannot_see_or_touch_another_ones_files() -> None:
    with PythonSandbox(LIMITS) as a, PythonSandbox(LIMITS) as b:
        a.run("open('secret.txt', 'w').write('a')")
        target = os.path.join(a.workdir, "secret.txt")
        seen = os.path.join(a.host_workdir, "secret.txt")
        out = b.run(HOOK_OFF + f"import os\ntry:\n    print(open({target!r}).read())\nexcept OSError as e:\n"
                               f"    print('no', e.errno)\ntry:\n    os.remove({target!r})\nexcept OSError as e:\n"
                               "    print('no', e.errno)").output
        assert out.count("no ") == 2 and os.path.exists(seen)
    assert settled() == []


def test_the_file_system_is_read_only_but_the_working_directory(box: PythonSandbox) -> None:
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = run(box, f"import os\nfor d in ('/usr', {sys.prefix!r}, {here!r}, '/'):\n"
                   "    try:\n        open(os.path.join(d, 'pwned'), 'w')\n        print('wrote', d)\n"
                   "    except OSError as e:\n        print('refused', e.errno)\n"
                   "open('mine.txt', 'w').write('ok')\nprint(open('mine.txt').read())")
    assert "wrote" not in out and out.rstrip().endswith("ok")


# --------------------------------------------------------------------------- processes
def test_no_signal_reaches_a_process_outside_the_sandbox(box: PythonSandbox, victim: subprocess.Popen) -> None:
    out = run(box, LIBC + f"for sig in (19, 9):\n    print(libc.kill({victim.pid}, sig), ctypes.get_errno())\n"
                   "print(libc.kill(1, 9))\n"  # the lineage's pid 1 ignores it: the fixture's print(6*7) still works
                   "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert victim.poll() is None, out
    pids = [int(p) for p in out.strip().splitlines()[-1].strip("[]").split(", ")]
    assert 1 in pids and len(pids) < 10 and os.getpid() not in pids  # its own PID namespace and /proc


def test_one_episode_cannot_stop_another_ones_worker() -> None:
    with PythonSandbox(LIMITS) as a, PythonSandbox(LIMITS) as b:
        b.run("y = 2")
        out = a.run(HOOK_OFF + LIBC + f"print(libc.kill({b.pid}, 19), ctypes.get_errno())\n"
                                      "import signal\nfor p in os.listdir('/proc'):\n"
                                      "    if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()):\n"
                                      "        os.kill(int(p), signal.SIGSTOP)").output
        assert b.run("print(6*7)").output == "42\n", out
        assert b.run("y").output == "2\n"
    assert settled() == []


def test_process_limits_are_per_sandbox() -> None:
    tight = SandboxLimits(timeout_s=5.0, cpu_s=5, processes=8)
    hog = HOOK_OFF + ("import os, time\nkids = 0\nfor _ in range(20):\n    try:\n        pid = os.fork()\n"
                      "    except OSError:\n        break\n    if pid == 0:\n        os.setsid()\n"
                      "        time.sleep(600)\n        os._exit(0)\n    kids += 1\nprint(kids)")
    with PythonSandbox(tight) as a, PythonSandbox(tight) as b:
        a.run("1")
        b.run("1")
        spawned = int(a.run(hog).output)
        assert spawned < 20  # a hit its limit ...
        out = b.run(HOOK_OFF + "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
                               "print('forked')").output
        assert out == "forked\n"  # ... which b does not share
    assert settled() == []


def test_nothing_a_cell_starts_outlives_the_cell() -> None:
    # A daemon (double fork + setsid), a plain child, a process that burns CPU: each is gone when its cell
    # returns, and so is a thread the cell left (the cell is not committed).
    box = PythonSandbox(LIMITS, prefork=False)  # exact counts: no cell process forked ahead (test_prefork.py)
    box.run("1")
    baseline = settled_at(2)  # the supervisor and the worker
    daemon = HOOK_OFF + ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                         "        time.sleep(600)\n    os._exit(0)\ntime.sleep(0.2)")
    child = HOOK_OFF + "import os, time\nif os.fork() == 0:\n    time.sleep(600)\n    os._exit(0)"
    burner = HOOK_OFF + "import os\nif os.fork() == 0:\n    os.setsid()\n    while True:\n        pass"
    for code in (daemon, child, burner):
        box.run(code)
        assert len(settled_at(len(baseline))) == len(baseline), code
    out = box.run(HOOK_OFF + "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\nz = 1")
    assert "thread" in out.output and not out.committed and box.run("print('z' in dir())").output == "False\n"
    assert len(settled_at(len(baseline))) == len(baseline)
    box.close()
    assert settled() == []


def test_a_branch_leaves_nothing_behind_while_its_snapshot_lives() -> None:
    box = PythonSandbox(LIMITS)
    box.run("x = 1")
    snap = box.snapshot()
    box.close()
    frozen = sandbox_processes()
    branch = PythonSandbox(LIMITS)
    branch.restore(snap)
    branch.run(HOOK_OFF + "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                          "        time.sleep(600)\n    os._exit(0)\ntime.sleep(0.2)")
    branch.close()
    for _ in range(100):
        if sandbox_processes() == frozen:
            break
        time.sleep(0.02)
    assert sandbox_processes() == frozen  # only the snapshot's frozen fork
    again = PythonSandbox(LIMITS)
    again.restore(snap)
    assert again.run("x").output == "1\n"
    again.close()
    snap.release()
    assert settled() == []


# --------------------------------------------------------------------------- restore and crashes
def test_a_killed_frozen_snapshot_falls_back_to_replay() -> None:
    box = PythonSandbox(LIMITS)
    box.run("x = 41")
    snap = box.snapshot()
    # A cell kills every other process of its lineage it can see: the frozen snapshot among them.
    box.run(HOOK_OFF + "import os, signal\nfor p in os.listdir('/proc'):\n"
                       "    if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()):\n"
                       "        os.kill(int(p), signal.SIGKILL)")
    branch = PythonSandbox(LIMITS)
    branch.restore(snap)
    result = branch.run("x + 1")
    assert result.output.startswith("42\n") and "re-running" in result.output
    assert branch.run("print(6*7)").output == "42\n"
    branch.close()
    box.close()
    snap.release()
    assert settled() == []


def test_a_stopped_frozen_snapshot_falls_back_to_replay() -> None:
    box = PythonSandbox(LIMITS)
    box.run("x = 41")
    snap = box.snapshot()
    box.run(HOOK_OFF + "import os, signal\nfor p in os.listdir('/proc'):\n"
                       "    if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()):\n"
                       "        os.kill(int(p), signal.SIGSTOP)")
    branch = PythonSandbox(LIMITS)
    branch.restore(snap)
    assert branch.run("x + 1").output.startswith("42\n")
    branch.close()
    box.close()
    snap.release()
    assert settled() == []


def test_a_cell_that_kills_its_worker_gets_the_truth_and_the_state_back(box: PythonSandbox) -> None:
    result = box.run(HOOK_OFF + "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert result.status == "crashed" and "rebuilt" in result.output and not result.committed
    assert box.run("keep").output == "'still here'\n"


# --------------------------------------------------------------------------- each layer on its own
SYSCALLS = {  # name: (libc call, what success looks like)
    "unshare_user": ("libc.unshare(0x10000000)", "0"),
    "socket_inet": ("libc.socket(2, 1, 0)", "fd"),
    "mount_tmpfs": ("libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)", "0"),
    "ptrace_traceme": ("libc.ptrace(0, 0, 0, 0)", "0"),
}


def _syscall_results(isolation: str) -> dict[str, tuple[int, int]]:
    code = HOOK_OFF + LIBC + "".join(f"r = {call}\nprint('{name}', r, ctypes.get_errno())\n"
                                     for name, (call, _) in SYSCALLS.items())
    with PythonSandbox(LIMITS, isolation=isolation) as box:
        out = box.run(code).output
        assert box.run("print(6*7)").output == "42\n"
    results = {}
    for line in out.strip().splitlines():
        name, ret, err = line.split()
        results[name] = (int(ret), int(err))
    return results


def test_seccomp_refuses_what_the_namespaces_alone_allow() -> None:
    jailed, namespaced = _syscall_results("jail"), _syscall_results("namespaces")
    for name in SYSCALLS:
        assert jailed[name] == (-1, 1), (name, jailed[name])  # EPERM from the filter
    # Without the filter the same calls reach the kernel: a socket opens, a nested user namespace is made.
    assert namespaced["socket_inet"][0] >= 0 and namespaced["unshare_user"][0] == 0
    assert settled() == []


def test_the_network_namespace_alone_stops_a_connection(listener) -> None:
    port, accepted = listener
    with PythonSandbox(LIMITS, isolation="namespaces") as box:
        out = box.run(HOOK_OFF + "import socket\ns = socket.socket()\nprint('socket ok')\ntry:\n"
                                 f"    s.connect(('127.0.0.1', {port}))\n    print('connected')\n"
                                 "except OSError as e:\n    print('refused', e.errno)").output
        assert box.run("print(6*7)").output == "42\n"
    time.sleep(0.2)
    assert "socket ok" in out and "connected" not in out and accepted == []
    assert settled() == []
