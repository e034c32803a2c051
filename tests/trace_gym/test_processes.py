"""What trace_gym.processes reads from /proc: a child's parent, state and start time, the live children apart from
a zombie, and nothing once the process is gone; a command name with spaces and parentheses does not shift the
fields."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from trace_gym import processes


def test_a_child_is_seen_live_then_as_a_zombie_then_not_at_all(tmp_path: Path) -> None:
    odd = tmp_path / "a b) (c"  # the kernel writes the command name in parentheses, as it is
    shutil.copy("/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "30"])
    try:
        me = os.getpid()
        assert processes.parent_pid(child.pid) == me and processes.state(child.pid) in ("R", "S")
        assert processes.start_time(child.pid) is not None
        assert child.pid in processes.children(me, live=True) and child.pid in processes.descendant_pids()
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(500):  # the kill lands at once; the child stays a zombie until it is waited for
            if processes.state(child.pid) == "Z":
                break
            time.sleep(0.01)
        assert processes.state(child.pid) == "Z"
        assert child.pid in processes.children(me) and child.pid not in processes.children(me, live=True)
    finally:
        child.kill()
        child.wait()
    assert processes.state(child.pid) is None and processes.parent_pid(child.pid) is None
    assert processes.start_time(child.pid) is None and child.pid not in processes.children(os.getpid())
