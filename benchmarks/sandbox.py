"""Sandbox costs with the jail on, each a median per run and reported as a range over runs (machines are noisy):

- a cell (``x += 1``) in a persistent jailed worker against a fresh ``python -c`` per call: after the model's
  turn (the worker idle for ``--gap`` ms first, time it uses to fork the cell's process) and back to back
  (no idle time), each with the pre-forked cell process and without it (``prefork=False``), and the unjailed
  level (isolation="none") as the reference;
- episode start (a new lineage: namespaces, mounts, seccomp, first cell included);
- a native snapshot, and a native restore two ways: to a worker ready for the next cell (what DeltaBox's
  1.86 ms rollback measures: fork of a frozen process) and with its first cell and close; replay against depth;
- a bounded call (environments/sandbox/bounded.py) against the same call in-process.

The variants run interleaved in one process, so load on the machine hits them alike.

    python benchmarks/sandbox.py [--quick] [--runs 3] [--gap 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from _common import machine, write_json

from trace_gym.environments.sandbox.bounded import bounded_call
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, SandboxSnapshot, start_template

# isolation="none" counts every process of the sandbox user on the machine against the process limit
LIMITS = SandboxLimits(timeout_s=30, cpu_s=30, processes=1 << 16)
# Published figures of DeltaBox (arXiv 2605.22781), for comparison: a rollback forks a frozen template process.
DELTABOX_MS = {"restore": 1.86, "checkpoint": 10.8}


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int, n: int, gap_s: float = 0.0) -> dict[str, float]:
    """Median ms of each fn, measured in alternating blocks; ``gap_s`` of idle time before each call."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(n):
                if gap_s:
                    time.sleep(gap_s)
                t = time.perf_counter()
                fn()
                samples[name].append(1000 * (time.perf_counter() - t))
    return {k: statistics.median(v) for k, v in samples.items()}


def _restore(snap: SandboxSnapshot, prefork: bool = True) -> PythonSandbox:
    box = PythonSandbox(LIMITS, prefork=prefork)
    box.restore(snap)
    return box


def _to_ready(snap: SandboxSnapshot) -> float:
    """ms from a restore to a worker ready for the next cell (the restore itself is lazy: the start forks)."""
    box = _restore(snap)
    t = time.perf_counter()
    box._start()
    ms = 1000 * (time.perf_counter() - t)
    box.close()
    return ms


def one_run(n: int, depths: list[int], gap_s: float) -> dict[str, object]:
    """Every measure once (each a median of ``n``-sized blocks)."""
    levels = ("jail", "none")
    boxes = {"jail": PythonSandbox(LIMITS), "jail, no prefork": PythonSandbox(LIMITS, prefork=False),
             "none": PythonSandbox(LIMITS, isolation="none")}
    for box in boxes.values():
        box.run("x = 0")
    after_turn = _interleaved({k: (lambda b=b: b.run("x += 1")) for k, b in boxes.items()}, 4, n * 2, gap_s)
    back_to_back = _interleaved({k: (lambda b=b: b.run("x += 1")) for k, b in boxes.items()}, 4, n * 2)
    snaps = {}
    for name in ("jail", "jail, no prefork"):
        snaps[name] = boxes[name].snapshot()
    snapshot_ms = _interleaved({"native": lambda: boxes["jail"].snapshot().release()}, 2, n)["native"]
    for box in boxes.values():
        box.close()
    fresh = statistics.median(
        [_timed(lambda: subprocess.run([sys.executable, "-c", "x = 1"], check=True)) for _ in range(n)])

    def start(level: str) -> None:
        b = PythonSandbox(LIMITS, isolation=level)
        b.run("1", more=False)
        b.close()

    episode = _interleaved({level: (lambda lv=level: start(lv)) for level in levels}, 2, max(3, n // 2))
    assert bounded_call(abs, -1).value == 1  # starts the call server; abs travels by reference
    calls = _interleaved({"bounded": lambda: bounded_call(abs, -1), "in-process": lambda: abs(-1)}, 2, n * 2)

    ready = statistics.median([_to_ready(snaps["jail"]) for _ in range(n * 2)])

    def full(name: str) -> None:
        box = _restore(snaps[name], prefork=name == "jail")
        box.run("x", more=False)
        box.close()

    with_cell = _interleaved({k: (lambda k=k: full(k)) for k in snaps}, 2, n)
    for snap in snaps.values():
        snap.release()

    slow = "import time\n_t = time.perf_counter()\nwhile time.perf_counter() - _t < 0.05:\n    pass\nx += 1"
    rows = []
    for depth in depths:
        b = PythonSandbox(LIMITS)
        b.run("x = 0")
        for _ in range(depth - 1):
            b.run(slow)
        snap, portable = b.snapshot(native=True), b.snapshot(native=False)

        def restore(s: SandboxSnapshot) -> None:
            r = _restore(s)
            r.run("x", more=False)
            r.close()

        native_ms = statistics.median([_timed(lambda s=snap: restore(s)) for _ in range(max(3, n // 2))])
        replay_ms = statistics.median([_timed(lambda p=portable: restore(p)) for _ in range(3)])
        rows.append({"depth": depth, "native_ms": native_ms, "replay_ms": replay_ms,
                     "replay_over_native": replay_ms / native_ms})
        snap.release()
        b.close()
    return {"cell_after_turn_ms": after_turn, "cell_back_to_back_ms": back_to_back, "fresh_python_c_ms": fresh,
            "episode_start_ms": episode, "bounded_call_ms": calls, "snapshot_ms": snapshot_ms,
            "restore_to_ready_ms": ready, "restore_cell_close_ms": with_cell, "restore_vs_depth": rows,
            "load_average": os.getloadavg()[0]}


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t)


def _span(values: list[float], digits: int = 1) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}-{hi:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and depths")
    parser.add_argument("--runs", type=int, default=3, help="runs of every measure (each reported as a range)")
    parser.add_argument("--gap", type=float, default=10.0, help="ms of idle time before a cell (the model's turn)")
    args = parser.parse_args()
    n = 5 if args.quick else 20
    depths = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16]
    for level in ("jail", "none"):
        start_template(isolation=level)
    fresh_np = statistics.median(
        [_timed(lambda: subprocess.run([sys.executable, "-c", "import numpy, sympy"], check=True)) for _ in range(3)])
    runs = [one_run(n, depths, args.gap / 1000) for _ in range(args.runs)]

    def col(key: str, sub: str | None = None) -> list[float]:
        return [float(r[key][sub] if sub is not None else r[key]) for r in runs]  # type: ignore[index]

    fresh = col("fresh_python_c_ms")
    print(f"{'per-cell overhead (medians; range over ' + str(args.runs) + ' runs)':<58}{'ms':>14}{'fresh/x':>12}")
    cells: dict[str, dict[str, list[float]]] = {}
    for when, key in (("after the model's turn", "cell_after_turn_ms"), ("back to back", "cell_back_to_back_ms")):
        for variant in ("jail", "jail, no prefork", "none"):
            ms = col(key, variant)
            ratio = [f / m for f, m in zip(fresh, ms)]
            cells.setdefault(key, {})[variant] = ratio
            name = f"cell, isolation={variant}, {when}"
            print(f"{name:<58}{_span(ms, 2):>14}{_span(ratio):>12}")
    print(f"{'fresh python -c':<58}{_span(fresh, 1):>14}{'1.0':>12}")
    print(f"{'fresh python -c importing numpy+sympy (once)':<58}{fresh_np:>14.0f}{fresh[0] / fresh_np:>12.2f}")
    for level in ("jail", "none"):
        print(f"{'episode start (first cell incl.), ' + level:<58}{_span(col('episode_start_ms', level)):>14}")
    print(f"{'bounded call (fork of the call server)':<58}{_span(col('bounded_call_ms', 'bounded'), 2):>14}")
    print(f"\n{'snapshot and restore, jail on (medians, ms)':<58}{'ours':>14}{'DeltaBox':>12}")
    print(f"{'native snapshot (frozen fork, files copied and digested)':<58}{_span(col('snapshot_ms')):>14}"
          f"{DELTABOX_MS['checkpoint']:>12}")
    print(f"{'native restore, to a worker ready for a cell':<58}{_span(col('restore_to_ready_ms'), 2):>14}"
          f"{DELTABOX_MS['restore']:>12}")
    print(f"{'native restore + first cell + close':<58}{_span(col('restore_cell_close_ms', 'jail')):>14}")
    print(f"{'  the same without the pre-forked cell process':<58}"
          f"{_span(col('restore_cell_close_ms', 'jail, no prefork')):>14}")
    head = "depth (cells of ~50 ms): restore + cell + close"
    print(f"\n{head:<48}{'native ms':>12}{'replay ms':>12}{'replay/native':>15}")
    for i, depth in enumerate(depths):
        native = [r["restore_vs_depth"][i]["native_ms"] for r in runs]  # type: ignore[index]
        replay = [r["restore_vs_depth"][i]["replay_ms"] for r in runs]  # type: ignore[index]
        print(f"{depth:<48}{_span(native):>12}{_span(replay, 0):>12}"
              f"{_span([b / a for a, b in zip(native, replay)]):>15}")
    loads = col("load_average")
    print(f"\nload average {_span(loads)} on {machine()['cpus']} cores")
    result = {"runs": runs, "fresh_python_c_numpy_sympy_ms": fresh_np, "speedup_vs_fresh": cells,
              "deltabox_ms": DELTABOX_MS, "gap_ms": args.gap, "machine": machine(), "quick": args.quick}
    print(f"wrote {write_json('sandbox', result)}")


if __name__ == "__main__":
    main()
