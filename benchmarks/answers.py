"""Math answer check costs: typical answers (each path of the check) and the hostile-answer corpus by class
(tests/environments/math/hostile_answers.py), after the jailed checker is warm. Prints a table and writes
benchmarks/results/answers.json.

    python benchmarks/answers.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the corpus lives with the tests

from tests.environments.math import hostile_answers
from trace_gym.environments.math.answers import check_answer
from trace_gym.environments.math.jailed import start_checker

TYPICAL = {
    "exact string (GSM8K integer)": ("18", "18"),
    "numeric (0.5 against \\frac{1}{2})": ("0.5", "\\frac{1}{2}"),
    "grammar, exact value (2^{10})": ("2^{10}", "1024"),
    "jailed check, math-verify (\\frac{1}{\\sqrt{2}})": ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    "jailed check, a polynomial identity ((x+1)(x-1))": ("(x+1)(x-1)", "x^2-1"),
    "jailed check, a wrong tuple": ("(3, \\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
}
GOLDS = ["18", "\\frac{14}{3}", "\\left( 3, \\frac{\\pi}{2} \\right)"]


def _seconds(pred: str, gold: str) -> tuple[float, float, str]:
    t = time.perf_counter()
    reward, info = check_answer(pred, gold)
    return time.perf_counter() - t, reward, str(info["method"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats and one gold per hostile answer")
    args = parser.parse_args()
    repeats, golds = (3, GOLDS[:1]) if args.quick else (10, GOLDS)
    t = time.perf_counter()
    start_checker()
    warm_s = time.perf_counter() - t
    typical = {}
    for name, (pred, gold) in TYPICAL.items():
        runs = [_seconds(pred, gold) for _ in range(repeats)]
        typical[name] = {"median_ms": 1000 * statistics.median(r[0] for r in runs), "reward": runs[0][1],
                         "method": runs[0][2]}
    hostile, rewarded = {}, []
    with tempfile.TemporaryDirectory() as markers:
        for kind, answers in hostile_answers.corpus(markers).items():
            runs = [(a, *_seconds(a, g)) for a in answers for g in golds]
            rewarded += [a[:80] for a, _, reward, _ in runs if reward != 0.0]
            worst = max(runs, key=lambda r: r[1])
            methods = sorted({r[3] for r in runs})
            hostile[kind] = {"answers": len(answers), "checks": len(runs),
                             "median_ms": 1000 * statistics.median(r[1] for r in runs),
                             "max_ms": 1000 * worst[1], "worst": worst[0][:60], "methods": methods}
        files_left = os.listdir(markers)
    load = os.getloadavg()[0]
    print(f"checker start (template, lineage, setup cell): {warm_s:.2f} s; load average {load:.1f}")
    print(f"{'typical answer':<58}{'median ms':>10}  method")
    for name, row in typical.items():
        print(f"{name:<58}{row['median_ms']:>10.1f}  {row['method']}")
    print(f"\n{'hostile class':<12}{'answers':>8}{'checks':>8}{'median ms':>11}{'max ms':>9}  worst")
    for kind, row in hostile.items():
        print(f"{kind:<12}{row['answers']:>8}{row['checks']:>8}{row['median_ms']:>11.1f}{row['max_ms']:>9.0f}  "
              f"{row['worst']!r}")
    print(f"\nrewarded hostile answers: {len(rewarded)}; files created by them: {len(files_left)}")
    write_json("answers", {"machine": machine(), "load_average": load, "checker_start_s": warm_s,
                           "typical": typical, "hostile": hostile, "rewarded": rewarded, "files": files_left})


if __name__ == "__main__":
    main()
