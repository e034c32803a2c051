"""Sandbox costs with the jail on: per-cell overhead (persistent forked worker vs a fresh `python -c` per call),
episode start (a new lineage: namespaces, mounts, seccomp), native fork restore vs replay against depth (cells of
~50 ms), and a bounded call (environments/sandbox/bounded.py) against the same call in-process. The unjailed level
(isolation="none") runs interleaved with the jail as the reference, so load on the machine hits both alike.

    python benchmarks/sandbox.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from _common import machine, write_json

from trace_gym.environments.sandbox.bounded import bounded_call
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, start_template

# isolation="none" counts every process of the sandbox user on the machine against the process limit
LIMITS = SandboxLimits(timeout_s=30, cpu_s=30, processes=1 << 16)


def _ms(fn, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t))
    return times


def _interleaved(fns: dict[str, object], rounds: int, n: int) -> dict[str, float]:
    """Median ms of each fn, measured in alternating blocks."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += _ms(fn, n)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and depths")
    args = parser.parse_args()
    n = 5 if args.quick else 20
    depths = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16]
    levels = ("jail", "none")
    for level in levels:
        start_template(isolation=level)

    boxes = {level: PythonSandbox(LIMITS, isolation=level) for level in levels}
    for box in boxes.values():
        box.run("x = 0")
    cells = _interleaved({level: (lambda b=b: b.run("x += 1")) for level, b in boxes.items()}, 4, n * 3)
    for box in boxes.values():
        box.close()
    fresh = statistics.median(_ms(lambda: subprocess.run([sys.executable, "-c", "x = 1"], check=True), n))
    fresh_np = statistics.median(_ms(lambda: subprocess.run([sys.executable, "-c", "import numpy, sympy"],
                                                            check=True), 3))

    def start(level: str) -> None:
        b = PythonSandbox(LIMITS, isolation=level)
        b.run("1")
        b.close()

    episode = _interleaved({level: (lambda lv=level: start(lv)) for level in levels}, 2, max(3, n // 2))

    assert bounded_call(abs, -1).value == 1  # starts the call server; abs travels by reference
    calls = _interleaved({"bounded": lambda: bounded_call(abs, -1), "in-process": lambda: abs(-1)}, 2, n * 2)

    slow = "import time\n_t = time.perf_counter()\nwhile time.perf_counter() - _t < 0.05:\n    pass\nx += 1"
    rows = []
    for depth in depths:
        b = PythonSandbox(LIMITS)
        b.run("x = 0")
        for _ in range(depth - 1):
            b.run(slow)
        snap, portable = b.snapshot(native=True), b.snapshot(native=False)

        def restore(s) -> None:
            r = PythonSandbox(LIMITS)
            r.restore(s)
            r.run("x")
            r.close()

        native_ms = statistics.median(_ms(lambda snap=snap: restore(snap), max(3, n // 2)))
        replay_ms = statistics.median(_ms(lambda p=portable: restore(p), 3))
        rows.append({"depth": depth, "native_ms": native_ms, "replay_ms": replay_ms,
                     "replay_over_native": replay_ms / native_ms})
        snap.release()
        b.close()

    cell = cells["jail"]
    result = {"per_cell_ms": cells, "fresh_python_c_ms": fresh, "fresh_python_c_numpy_sympy_ms": fresh_np,
              "speedup_vs_fresh": fresh / cell, "speedup_vs_fresh_with_imports": fresh_np / cell,
              "episode_start_ms": episode, "bounded_call_ms": calls, "restore_vs_depth": rows,
              "load_average": os.getloadavg(), "machine": machine(), "quick": args.quick}
    print(f"{'per-cell overhead':<46}{'ms':>10}{'fresh/x':>10}")
    for level in levels:
        print(f"{'sandbox cell, isolation=' + level:<46}{cells[level]:>10.2f}{fresh / cells[level]:>10.1f}")
    print(f"{'fresh python -c':<46}{fresh:>10.2f}{1.0:>10.1f}")
    print(f"{'fresh python -c importing numpy+sympy':<46}{fresh_np:>10.2f}{fresh / fresh_np:>10.2f}")
    for level in levels:
        print(f"{'episode start (first cell incl.), ' + level:<46}{episode[level]:>10.2f}")
    print(f"{'bounded call (fork of the call server)':<46}{calls['bounded']:>10.2f}")
    print(f"{'the same call in-process':<46}{calls['in-process']:>10.4f}")
    print(f"\njail on: {'depth':>6}{'native restore ms':>20}{'replay ms':>12}{'replay/native':>15}")
    for r in rows:
        print(f"{'':9}{r['depth']:>6}{r['native_ms']:>20.2f}{r['replay_ms']:>12.2f}{r['replay_over_native']:>15.1f}")
    print(f"\nload average {os.getloadavg()[0]:.1f} on {machine()['cpus']} cores")
    print(f"wrote {write_json('sandbox', result)}")


if __name__ == "__main__":
    main()
