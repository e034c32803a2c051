"""Sandbox costs: per-cell overhead (persistent forked worker vs a fresh `python -c` per call), episode start,
and native fork restore vs replay against depth (cells of ~50 ms).

    python benchmarks/sandbox.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trace_gym.environments.sandbox import PythonSandbox, SandboxLimits, start_template


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and depths")
    args = parser.parse_args()
    n = 5 if args.quick else 20
    depths = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16]
    limits = SandboxLimits(timeout_s=30, cpu_s=30)
    start_template()

    box = PythonSandbox(limits)
    box.run("x = 0")
    cell = _median_ms(lambda: box.run("x += 1"), n * 5)
    fresh = _median_ms(lambda: subprocess.run([sys.executable, "-c", "x = 1"], check=True), n)
    fresh_np = _median_ms(lambda: subprocess.run([sys.executable, "-c", "import numpy, sympy"], check=True), 3)

    def start() -> None:
        b = PythonSandbox(limits)
        b.run("1")
        b.close()

    episode = _median_ms(start, n)
    box.close()

    slow = "import time\n_t = time.perf_counter()\nwhile time.perf_counter() - _t < 0.05:\n    pass\nx += 1"
    rows = []
    for depth in depths:
        b = PythonSandbox(limits)
        b.run("x = 0")
        for _ in range(depth - 1):
            b.run(slow)
        snap, portable = b.snapshot(native=True), b.snapshot(native=False)

        def restore(s) -> None:
            r = PythonSandbox(limits)
            r.restore(s)
            r.run("x")
            r.close()

        native_ms = _median_ms(lambda snap=snap: restore(snap), max(3, n // 2))
        replay_ms = _median_ms(lambda p=portable: restore(p), 3)
        rows.append({"depth": depth, "native_ms": native_ms, "replay_ms": replay_ms,
                     "replay_over_native": replay_ms / native_ms})
        snap.release()
        b.close()

    result = {"per_cell_ms": cell, "fresh_python_c_ms": fresh, "fresh_python_c_numpy_sympy_ms": fresh_np,
              "speedup_vs_fresh": fresh / cell, "speedup_vs_fresh_with_imports": fresh_np / cell,
              "episode_start_ms": episode, "restore_vs_depth": rows, "quick": args.quick}
    print(f"{'per-cell overhead':<40}{'ms':>10}{'ratio':>10}")
    print(f"{'persistent sandbox (fork per cell)':<40}{cell:>10.2f}{1.0:>10.1f}")
    print(f"{'fresh python -c':<40}{fresh:>10.2f}{fresh / cell:>10.1f}")
    print(f"{'fresh python -c importing numpy+sympy':<40}{fresh_np:>10.2f}{fresh_np / cell:>10.1f}")
    print(f"{'episode start (first cell incl.)':<40}{episode:>10.2f}")
    print(f"\n{'depth':>6}{'native restore ms':>20}{'replay ms':>12}{'replay/native':>15}")
    for r in rows:
        print(f"{r['depth']:>6}{r['native_ms']:>20.2f}{r['replay_ms']:>12.2f}{r['replay_over_native']:>15.1f}")
    out = Path(__file__).parent / "results" / "sandbox.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
