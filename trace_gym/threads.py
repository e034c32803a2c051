"""How many threads torch's CPU kernels use: the cores this process may run on, less the ones others keep busy.

torch leaves its intra-op pool at the machine's core count and its OpenMP threads spin while they wait. Beside
other work that is ruinous on a small machine: every parallel region waits for its slowest thread, a thread that
lost its core waits a whole scheduler slice, and a spinning waiter burns the time its partner needed. Measured on
2 cores at a load of 13, one thread generated 5.2 tokens/s and two 0.2. So:

- the cores are those of this process's CPU affinity, capped by its cgroup's CPU quota (a container's
  ``cpu.max``), not ``os.cpu_count()``;
- ``OMP_NUM_THREADS`` (or ``TRACE_GYM_THREADS``), when the user sets it, is the answer as given;
- otherwise the count is the usable cores less the other tasks that want a CPU now (the kernel's count of
  runnable tasks less this process's own runnable threads, a median of a few reads), at least one. ``adapt``
  re-reads it between units of work, so a job gives a core back when other work arrives and takes it again when
  it leaves;
- OpenMP's pool is sized to the usable cores when torch loads, so ``configure`` runs before the first
  ``import torch`` (the CLI calls it first thing). Its waiters keep libgomp's default spin: a short one
  (``GOMP_SPINCOUNT`` of 1,000-10,000) lets two threads share the cores with busy processes (1.1-1.3x one
  thread's rate beside two), but costs the quickstart's warm start about a fifth of its idle rate, the case that
  matters most; with one thread under load nobody waits. The figures are in docs/measured.md.

A small model's SFT does not rely on this: it splits each batch over one single-threaded process per usable core
(at most 4; `trace_gym.agents.data_parallel`), whose processes meet once a step instead of at every operator.

This module imports nothing heavy; torch is touched only if it is already imported.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ENV_OVERRIDE = ("TRACE_GYM_THREADS", "OMP_NUM_THREADS")
ADAPT_EVERY_S = 5.0  # how often ``adapt`` looks at the load again (a load average moves over seconds anyway)

_state: dict[str, Any] = {"checked": 0.0, "own": 0, "user": None, "configured": False}


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity, capped by a cgroup v2 ``cpu.max`` quota if one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup_root)
    return max(1, min(cores, quota)) if quota else max(1, cores)


def _cgroup_quota(root: Path) -> int | None:
    """⌈quota / period⌉ from this process's cgroup v2 ``cpu.max`` ("max 100000" is no quota), or None."""
    try:
        rel = next(line.split("::", 1)[1] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        quota, period = (root / rel.lstrip("/") / "cpu.max").read_text().split()[:2]
    except (OSError, StopIteration, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def requested() -> int | None:
    """The thread count the user set (``TRACE_GYM_THREADS``, else ``OMP_NUM_THREADS``) before ``configure`` ran,
    or None."""
    if _state["configured"]:
        return _state["user"]
    for name in ENV_OVERRIDE:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def runnable(samples: int = 11, gap_s: float = 0.005) -> float:
    """Tasks running or waiting for a CPU now, the caller included: the median of ``samples`` reads of the
    kernel's count (/proc/loadavg's fourth field), or the one-minute load average (plus the caller) where the
    count cannot be read."""
    return _median_reads(samples, gap_s, mine=False)


def others_runnable(samples: int = 11, gap_s: float = 0.005) -> float:
    """Tasks of other processes running or waiting for a CPU now: the median over ``samples`` reads of the
    kernel's count less this process's own runnable threads read at the same moment (an OpenMP thread that
    spins after a parallel region is runnable, and is ours)."""
    return _median_reads(samples, gap_s, mine=True)


def _median_reads(samples: int, gap_s: float, mine: bool) -> float:
    counts = []
    for i in range(samples):
        try:
            total = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return os.getloadavg()[0] + (0 if mine else 1)
        counts.append(total - _own_running() if mine else total)
        if i + 1 < samples:
            time.sleep(gap_s)
    return float(max(0, sorted(counts)[len(counts) // 2]))


def _own_running() -> int:
    """This process's threads in state R (running or runnable), from /proc/self/task/*/stat."""
    n = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the thread ended between the listing and the read
            continue
        fields = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and brackets
        n += bool(fields) and fields[0] == "R"
    return n


def choose(cores: int | None = None, load: float | None = None, own: int = 1) -> int:
    """Threads for torch when the user set none: ``cores`` less the tasks that are not ours, at least 1.

    With ``load`` (tasks that want a CPU, ``own`` of them ours) the others are ``load - own``; without, they are
    read now (``others_runnable``). Fractions round to the nearest core: on 2 cores, 0.4 other tasks give 2
    threads, 1.6 give 1.
    """
    cores = usable_cores() if cores is None else cores
    others = others_runnable() if load is None else max(0.0, load - own)
    return max(1, min(cores, round(cores - others)))


def configure() -> int:
    """Set the thread count before torch loads (the OpenMP pool's size), and on torch if it is already loaded;
    returns the count. Idempotent; a user's ``OMP_NUM_THREADS`` stays."""
    if not _state["configured"]:
        _state["user"] = requested()
        _state["configured"] = True
    user = _state["user"]
    n = user if user is not None else choose()
    if "torch" not in sys.modules and "OMP_NUM_THREADS" not in os.environ:
        # OpenMP sizes its pool from this when torch loads; set_num_threads later picks how many of it run.
        os.environ["OMP_NUM_THREADS"] = str(usable_cores() if user is None else user)
    _apply(n)
    return n


def adapt(force: bool = False) -> int | None:
    """Between units of work (a training step, an SFT step, an episode): re-choose the count from the current
    load, at most every ``ADAPT_EVERY_S`` seconds; returns the new count, or None when it did not look (too soon,
    not configured, or a count the user set, which is never changed)."""
    now = time.monotonic()
    if not _state["configured"]:
        return None
    if _state["user"] is not None:  # kept as set (torch may have loaded since configure)
        _apply(_state["user"])
        return None
    if not force and now - _state["checked"] < ADAPT_EVERY_S:
        return None
    _state["checked"] = now
    n = choose()
    _apply(n)
    return n


def _apply(n: int) -> None:
    _state["own"] = n
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
