"""torch's thread count: the usable cores less the tasks of others, a user's setting kept."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trace_gym import threads


@pytest.mark.parametrize(("cores", "load", "own", "expected"), [
    (2, 1.0, 1, 2),  # idle: only the caller runs, every core
    (2, 1.4, 1, 2),  # a little background work rounds away
    (2, 2.6, 1, 1),  # one core's worth of others: one thread
    (2, 14.0, 1, 1),  # a crowded machine: one thread, never zero
    (2, 2.2, 2, 2),  # the load is mostly our own two threads
    (8, 3.0, 1, 6),
])
def test_choose_gives_the_cores_others_leave(cores: int, load: float, own: int, expected: int) -> None:
    assert threads.choose(cores=cores, load=load, own=own) == expected


def _highest(read: Callable[[], float], target: float) -> float:
    """The highest of repeated ``read()`` until it reaches ``target`` or 30 s pass."""
    deadline, seen = time.monotonic() + 30, 0.0
    while seen < target and time.monotonic() < deadline:
        seen = max(seen, read())
    return seen


def _highest_beside_a_spinner(read: Callable[[], float], target: float) -> float:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:  # once started, the spinner is always runnable
        return _highest(read, target)
    finally:
        spinner.kill()
        spinner.wait()


def test_runnable_counts_the_caller_and_a_busy_process() -> None:
    assert threads.runnable() >= 1
    assert _highest_beside_a_spinner(threads.runnable, 2) >= 2


def test_a_cgroup_quota_caps_the_cores(tmp_path: Path) -> None:
    rel = next(line.split("::", 1)[1] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if line.startswith("0::"))
    folder = tmp_path / rel.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text("100000 100000\n")  # one core's time per period
    assert threads.usable_cores(tmp_path) == 1
    (folder / "cpu.max").write_text("max 100000\n")
    assert threads.usable_cores(tmp_path) == len(os.sched_getaffinity(0))


PROBE = """
import json, os, sys
from trace_gym import threads
n = threads.configure()
import torch
again = threads.adapt(force=True)
print(json.dumps({"configured": n, "torch": torch.get_num_threads(), "adapted": again,
                  "omp": os.environ.get("OMP_NUM_THREADS"), "wait": os.environ.get("OMP_WAIT_POLICY"),
                  "spin": os.environ.get("GOMP_SPINCOUNT")}))
"""


def _probe(env: dict[str, str], *prefix: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                             "GOMP_SPINCOUNT", "TRACE_GYM_THREADS")}
    out = subprocess.run([*prefix, sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_configure_sizes_the_pool_to_the_affinity() -> None:
    got = _probe({}, "taskset", "-c", "0")  # one core allowed, whatever the machine has
    assert got["omp"] == "1" and got["wait"] is None and got["spin"] is None  # libgomp's own waiting
    assert got["configured"] == got["torch"] == got["adapted"] == 1


def test_a_users_thread_count_is_kept_and_never_adapted() -> None:
    got = _probe({"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"})
    assert got["omp"] == "3" and got["wait"] == "ACTIVE" and got["spin"] is None  # the user's choice, as set
    assert got["configured"] == got["torch"] == 3 and got["adapted"] is None
    got = _probe({"TRACE_GYM_THREADS": "1"})
    assert got["configured"] == got["torch"] == 1 and got["adapted"] is None and got["spin"] is None
    got = _probe({"GOMP_SPINCOUNT": "5"})
    assert got["spin"] == "5"  # a user's spin count stays


def test_the_cli_configures_threads_before_a_command_loads_torch() -> None:
    code = ("import os; from trace_gym.training.cli.main import main; main(['envs']); "
            "print(os.environ.get('OMP_NUM_THREADS'))")
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                             "TRACE_GYM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == str(threads.usable_cores())


def test_own_running_counts_every_runnable_thread_of_ours() -> None:
    stop = threading.Event()
    data = b"x" * (1 << 22)

    def hash_forever() -> None:  # hashlib releases the GIL on large inputs: a thread of ours that stays runnable
        while not stop.is_set():
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=hash_forever)
    worker.start()
    try:
        seen = _highest(threads._own_running, 2)
    finally:
        stop.set()
        worker.join()
    assert seen >= 2  # the caller and the hashing thread


def test_others_runnable_counts_a_busy_process() -> None:
    assert _highest_beside_a_spinner(threads.others_runnable, 1) >= 1
