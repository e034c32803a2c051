"""Nothing a cell's code starts after the cell's reply lives into the next cell.

A committed cell's process becomes the worker, so the cell's code can arm anything the worker still runs after
the reply: rebound module functions, builtins, hooks, finalizers, at-fork callbacks, audit hooks, methods of
classes. Each route below forks a daemon (double fork + ``setsid``) from there, after the host's sweep; the next
cell looks for it. Two layers, each on its own: the runtime binds what it calls after a reply before any cell
runs (those routes never fire), and the sweep before the next cell ends what the others started.
"""

from __future__ import annotations

import time

import pytest

from tests.environments.sandbox.leaks import settled
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_bytes=1 << 30, processes=32)
TURN_S = 0.3  # the model's turn between the cells

# spawn() forks a daemon that writes "pid time-of-fork" to /tmp/daemons; only once the cell has committed (its
# process then clears its parent-death signal, which a cell's process and the one forked ahead keep until then),
# at most 4 times per process, never from within itself (its own forks run at-fork callbacks and audit hooks).
ARM = r"""
import sys, os, time, ctypes
sys.modules['__main__']._Guard.untrusted = False
sys.modules['__main__']._Guard._blocked_events = frozenset()  # the tripwire off for good: os.fork from hooks too
_prctl, _int, _byref, _count, _busy = ctypes.CDLL(None).prctl, ctypes.c_int, ctypes.byref, {}, []
def spawn(*_, _fork=os.fork, _exit=os._exit, _setsid=os.setsid, _open=os.open, _write=os.write, _getpid=os.getpid,
          _now=time.monotonic, _sleep=time.sleep):
    if _busy:
        return
    signal = _int(-1)
    _prctl(2, _byref(signal), 0, 0, 0)  # PR_GET_PDEATHSIG
    me = _getpid()
    if signal.value != 0 or _count.get(me, 0) >= 4:
        return
    _busy.append(me)
    try:
        _count[me] = _count.get(me, 0) + 1
        t = _now()
        if _fork() == 0:
            _setsid()
            if _fork() == 0:
                fd = _open('/tmp/daemons', 0o2101, 0o600)  # O_WRONLY | O_CREAT | O_APPEND
                _write(fd, f'{_getpid()} {t!r}\n'.encode())
                while True:
                    _sleep(1)
            _exit(0)
    finally:
        _busy.clear()
"""

# Routes the runtime no longer runs after a reply: it binds its modules' functions and builtins before any cell,
# and switches off profile and trace hooks and the garbage collector (finalizers, weakref callbacks) until the
# next cell's code. atexit and signal handlers never ran between cells.
PINNED = {
    # the reply sent, then a pause while the host sweeps, then the fork
    "wire.send": "import wire\n_o = wire.send\nwire.send = lambda *a, **k: (_o(*a, **k), time.sleep(0.05), spawn())[0]",
    "wire.recv": "import wire\n_o = wire.recv\nwire.recv = lambda *a, **k: (spawn(), _o(*a, **k))[1]",
    "os functions": "\n".join(f"_{n} = os.{n}\nos.{n} = lambda *a, _f=_{n}, **k: (spawn(), _f(*a, **k))[1]"
                              for n in ("fork", "close", "setpgid", "waitpid", "read", "write")),
    "signal functions": "import signal\n" + "\n".join(
        f"_{n} = signal.{n}\nsignal.{n} = lambda *a, _f=_{n}: (spawn(), _f(*a))[1]"
        for n in ("signal", "pthread_sigmask", "valid_signals")),
    "socket.socketpair": "import socket\n_o = socket.socketpair\nsocket.socketpair = lambda *a: (spawn(), _o(*a))[1]",
    "json.dumps": "import json\n_o = json.dumps\njson.dumps = lambda *a, **k: (spawn(), _o(*a, **k))[1]",
    "builtins": "import builtins\n" + "\n".join(
        f"_{n} = builtins.{n}\nbuiltins.{n} = lambda *a, _f=_{n}, **k: (spawn(), _f(*a, **k))[1]"
        for n in ("isinstance", "len", "__import__")),
    "profile hook": "sys.setprofile(spawn)",
    "trace hook": "sys.settrace(lambda *a: spawn())",
    "__del__ finalizer": "import gc\ngc.set_threshold(1)\nclass D:\n    def __init__(self):\n        self.me = self\n"
                         "    def __del__(self):\n        spawn()\n        D()\nD()",
    "weakref callback": "import gc, weakref\ngc.set_threshold(1)\nclass O:\n    pass\n_refs = []\n"
                        "def again(_=None):\n    spawn()\n    o = O()\n    o.me = o\n"
                        "    _refs.append(weakref.ref(o, again))\nagain()",
    "atexit": "import atexit\natexit.register(spawn)",
    "signal handler": "import signal\nsignal.signal(signal.SIGALRM, spawn)\n"
                      "signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)",
}
# Routes it still runs after a reply: callbacks the interpreter keeps (at-fork, audit hooks, which Python cannot
# remove), methods of classes, and the runtime's own objects. The sweep before the next cell is the layer.
REACHABLE = {
    "at-fork callbacks": "os.register_at_fork(before=spawn, after_in_parent=spawn, after_in_child=spawn)",
    "audit hook": "sys.addaudithook(spawn)",
    "socket method": "import socket\n_o = socket.socket.sendall\n"
                     "socket.socket.sendall = lambda *a: (spawn(), _o(*a))[1]",
    "json encoder method": "import json\n_o = json.JSONEncoder.encode\n"
                           "json.JSONEncoder.encode = lambda *a: (spawn(), _o(*a))[1]",
    "the runtime's own code": "_r = sys.modules['__main__']._Runtime\n_p = _r._prefork\n"
                              "_r._prefork = lambda *a: (spawn(), _p(*a))[1]",
}
CHECK = r"""
import os
alive, after = [], 0
lines = open('/tmp/daemons').read().splitlines() if os.path.exists('/tmp/daemons') else []
for line in lines:
    pid, t = line.split()
    if float(t) < T_NEXT:
        after += float(t) > T_REPLY
        try:
            with open(f'/proc/{pid}/stat') as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except OSError:
            continue
        if state not in 'ZX':
            alive.append(int(pid))
print(alive, after)
"""


@pytest.fixture(scope="module", autouse=True)
def template() -> None:
    start_template()


def attack(route: str) -> tuple[list[int], int]:
    """Arm ``route`` in a committed cell, let the model's turn pass, run the next cell; returns the daemons forked
    before that cell that were alive when its code ran, and how many were forked after the first cell's reply
    reached the host (after its sweep)."""
    with PythonSandbox(LIMITS) as box:
        box.run("x = 1")
        armed = box.run(ARM + {**PINNED, **REACHABLE}[route])
        assert armed.committed, armed.output
        t_reply = time.monotonic()
        time.sleep(TURN_S)
        t_next = time.monotonic()
        out = box.run(f"T_NEXT, T_REPLY = {t_next!r}, {t_reply!r}\n" + CHECK).output
        assert box.run("x").output == "1\n"
    assert settled() == []
    alive, after = out.rsplit("]", 1)
    return [int(p) for p in alive.strip("[ ").split(",") if p.strip()], int(after)


@pytest.mark.parametrize("route", PINNED)
def test_the_runtime_runs_nothing_a_cell_rebound_after_its_reply(route: str) -> None:
    alive, after = attack(route)
    assert after == 0  # never fired after the reply: the runtime's references were bound before the cell
    assert alive == []


@pytest.mark.parametrize("route", REACHABLE)
def test_what_the_worker_started_after_the_reply_is_gone_before_the_next_cell(route: str) -> None:
    alive, after = attack(route)
    assert after > 0  # it fired after the host's sweep, during the model's turn ...
    assert alive == []  # ... and the sweep before the next cell ended it


def test_a_thread_the_worker_started_after_the_reply_ends_the_worker() -> None:
    # A thread would fork after the sweep before the next cell; the worker it runs in is ended instead.
    box = PythonSandbox(LIMITS)
    box.run("x = 1")
    thread = ("import threading\ndef forever():\n    while True:\n        _count.clear()\n        spawn()\n"
              "        time.sleep(0.01)\n"
              "os.register_at_fork(after_in_parent=lambda: threading.Thread(target=forever, daemon=True).start())")
    assert box.run(ARM + thread).committed
    time.sleep(TURN_S)
    result = box.run("x")
    assert result.status == "crashed" and not result.committed and "thread" in result.output
    box.close()
    assert settled() == []


def test_a_thread_a_cell_hid_from_its_count_ends_the_worker_before_the_next_cell() -> None:
    # The cell's own count of its threads is model-patchable (it is committed); the kernel's count, read by the
    # host before the next cell, is not.
    box = PythonSandbox(LIMITS)
    box.run("x = 1")
    hidden = box.run("import sys, threading, time\nrt = sys.modules['__main__']\nrt._Guard.untrusted = False\n"
                     "rt.kernel.threads_of_self = lambda: 1\n"
                     "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()")
    assert hidden.committed
    result = box.run("x")
    assert result.status == "crashed" and not result.committed and "thread" in result.output
    box.close()
    assert settled() == []
