"""Hostile cells: each is contained, and the sandbox (holding earlier state) keeps working afterwards.

The suite ends by checking that no sandbox process is left alive."""

import os
import socket
import threading
import time

import pytest

from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, sandbox_processes

LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_bytes=1 << 30, max_output_chars=500)
SECRET = "TRACE_GYM_TEST_SECRET"

HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(10_000)",
    "memory_bomb": "blob = bytearray(8 << 30)",
    "memory_bomb_growing": "parts = []\nwhile True:\n    parts.append(bytearray(64 << 20))",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "os_system": "import os\nos.system('touch /tmp/trace_gym_pwned')",
    "subprocess": "import subprocess\nsubprocess.run(['id'])",
    "write_outside": "open('/tmp/trace_gym_pwned', 'w').write('x')",
    "write_outside_relative": "open('../../trace_gym_pwned', 'w').write('x')",
    "delete_outside": "import os\nos.remove('/etc/hostname')",
    "read_parent_env": f"import os\nprint(os.environ.get('{SECRET}', 'absent'))",
    "read_parent_proc_environ": "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read()[:50])",
    "huge_output": "print('x' * (100 << 20))",
    "sys_exit": "import sys\nsys.exit(3)",
    "os_exit": "import os\nos._exit(0)",
    "kill_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "kill_process_group": "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
    "deep_recursion": "def f(n):\n    return f(n + 1)\nf(0)",
    "deep_recursion_unlimited": "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
    "segfault_ctypes": "import ctypes\nctypes.string_at(0)",
    "load_libc": "import ctypes\nctypes.CDLL('libc.so.6').kill(1, 9)",
    "signal_tampering": "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGCHLD):\n"
                        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
    "close_stdout": "import sys, os\nsys.stdout.close()\nos.close(1)\nos.close(2)\nprint('after')",
    "raise_rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))",
}


@pytest.fixture(scope="module")
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[object] = []

    def serve() -> None:
        while True:
            try:
                accepted.append(server.accept())
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.fixture(scope="module")
def box():
    os.environ[SECRET] = "hunter2"
    sandbox = PythonSandbox(LIMITS)
    sandbox.run("keep = 'still here'")
    yield sandbox
    sandbox.close()
    del os.environ[SECRET]


def _assert_still_working(box: PythonSandbox) -> None:
    assert box.run("keep").output == "'still here'\n"
    assert box.run("print(21 * 2)").output == "42\n"


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_cell_is_contained(box: PythonSandbox, name: str) -> None:
    result = box.run(HOSTILE[name])
    assert isinstance(result.output, str) and len(result.output) < 2 * LIMITS.max_output_chars
    assert not os.path.exists("/tmp/trace_gym_pwned")
    assert "hunter2" not in result.output
    if name in ("infinite_loop", "sleep_forever", "signal_tampering"):
        assert result.status == "timeout" or "CPU" in result.output
    if name in ("segfault_ctypes", "os_exit"):
        assert result.status == "crashed"
    if name == "deep_recursion_unlimited":  # 3.11 keeps Python frames on the heap: a limit ends it, any of them
        assert result.status in ("crashed", "timeout", "error")
    if name in ("fork_bomb", "os_system", "subprocess", "write_outside", "kill_parent", "load_libc"):
        assert result.status == "error" and "blocked" in result.output
    if name == "huge_output":
        assert "truncated" in result.output
    _assert_still_working(box)


def test_network_connection_to_a_local_listener_fails(box: PythonSandbox, listener) -> None:
    port, accepted = listener
    result = box.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    assert result.status == "error"
    time.sleep(0.2)
    assert accepted == []
    _assert_still_working(box)


def test_network_is_unreachable_even_below_the_audit_hook(box: PythonSandbox, listener) -> None:
    if os.geteuid() != 0:
        pytest.skip("the network namespace needs root; only the audit hook applies")
    port, accepted = listener
    code = ("import _socket\ns = _socket.socket(2, 1)\n"  # _socket bypasses socket.socket but not the kernel
            f"try:\n    s.connect(('127.0.0.1', {port}))\nexcept OSError as e:\n    print(type(e).__name__)")
    result = box.run(code)
    assert accepted == [] and ("blocked" in result.output or "Error" in result.output)


def test_no_sandbox_process_is_left_after_close(box: PythonSandbox) -> None:
    snaps = [box.snapshot() for _ in range(2)]
    for s in snaps:
        s.release()
    box.close()
    for _ in range(100):
        if not sandbox_processes():
            break
        time.sleep(0.02)
    assert sandbox_processes() == []
