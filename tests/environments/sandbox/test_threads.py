"""A jail lives as long as its process, not as long as the thread that started it: the template and the call
server are started from a thread that then ends (as a request thread of a server, or a thread pool made per call,
would), and every later call, from other threads, finds the state it left."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import threading, time
from trace_gym.environments.sandbox.bounded import bounded_call, start_server
from trace_gym.environments.sandbox.host import PythonSandbox

def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    time.sleep(0.3)  # the thread is gone: a parent-death signal tied to it would have fired by now
    return out[0]

box = PythonSandbox()
print("first", in_thread(lambda: box.run("x = 41\nx").output.strip()))
print("second", in_thread(lambda: box.run("x + 1").output.strip()))
snap = in_thread(box.snapshot)
print("kind", snap.kind)
branch = PythonSandbox()
branch.restore(snap)
print("restored", in_thread(lambda: branch.run("x * 2").output.strip()))
print("again", in_thread(lambda: branch.run("x * 3").output.strip()))
server = in_thread(start_server)
print("bounded", in_thread(lambda: bounded_call(abs, -3).value), in_thread(lambda: bounded_call(abs, -4).value))
print("server", "same" if in_thread(start_server) == server else "restarted")
box.close()
branch.close()
snap.release()
"""


def test_the_jail_and_the_call_server_outlive_the_thread_that_started_them() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert out == {"first": "41", "second": "42", "kind": "native", "restored": "82", "again": "123",
                   "bounded": "3 4", "server": "same"}
