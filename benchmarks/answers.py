"""Math answer check costs and soundness, measured as an attacker and a trainer would see them. Prints tables and
writes benchmarks/results/answers.json.

- typical answers, one per path of the check: the median of each run, as a range over runs;
- where a symbolic check's time goes: the wait for a checker, the restore and the cell together, the check's
  own time in its cell, the close; beside it a restore with an empty cell (what the sandbox costs alone);
- one thread against two checking symbolic answers at once: checks per second, the ratio, a range over runs;
- the hostile-answer corpus (tests/environments/math/hostile_answers.py) by class: the static classes against a
  few golds, and the classes built from each gold (anagrams, near values, approximations, chains, hedges) over
  the bundled golds (every gold for those the host decides, a seeded sample for those that reach the jail).

    python benchmarks/answers.py [--quick] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import machine, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the corpus lives with the tests

from tests.environments.math import hostile_answers
from trace_gym.environments.math import jailed
from trace_gym.environments.math.answers import check_answer, normalize
from trace_gym.environments.sandbox.host import PythonSandbox

TYPICAL = {
    "exact string (GSM8K integer)": ("18", "18"),
    "numeric (0.5 against \\frac{1}{2})": ("0.5", "\\frac{1}{2}"),
    "grammar, exact value (2^{10})": ("2^{10}", "1024"),
    "word, compared as a string (\\text{east})": ("\\text{seat}", "\\text{east}"),
    "symbolic: \\frac{1}{\\sqrt{2}} (sympy)": ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    "symbolic: (x+1)(x-1) (sympy)": ("(x+1)(x-1)", "x^2-1"),
    "symbolic: a wrong tuple (sympy)": ("(3, \\pi)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    "symbolic: an interval (math-verify)": ("[2, \\frac{10}{2})", "[2,5)"),
}
SYMBOLIC = [pair for name, pair in TYPICAL.items() if "(sympy)" in name]
GOLDS = ["18", "\\frac{14}{3}", "\\left( 3, \\frac{\\pi}{2} \\right)"]
HOST_CLASSES = ("anagram", "near_value", "chain")  # decided without the jail: every bundled gold
JAIL_CLASSES = ("approximation", "hedge", "endpoints")  # a seeded sample of golds


def _span(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    lo, hi = min(values) * scale, max(values) * scale
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}-{hi:.{digits}f}"


def _seconds(pred: str, gold: str) -> tuple[float, float, str]:
    t = time.perf_counter()
    reward, info = check_answer(pred, gold)
    return time.perf_counter() - t, reward, str(info["method"])


def typical(runs: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (pred, gold) in TYPICAL.items():
        medians, first = [], None
        for _ in range(runs):
            samples = [_seconds(pred, gold) for _ in range(repeats)]
            first = first or samples[0]
            medians.append(statistics.median(s[0] for s in samples))
        assert first is not None
        out[name] = {"median_ms_per_run": [1000 * m for m in medians], "reward": first[1], "method": first[2]}
    return out


def _symbolic(pred: str, gold: str) -> dict[str, Any]:
    g = normalize(gold)
    outcome = jailed.symbolic_check([(gold, g)], pred, normalize(pred))
    assert outcome.ok, outcome.error
    return outcome.value


def profile(runs: int, repeats: int) -> dict[str, Any]:
    """Per run, the medians of each phase over ``repeats`` checks of each symbolic pair."""
    phases = ("total_s", "wait_s", "run_s", "wall_s", "close_s", "empty_s")
    out: dict[str, list[float]] = {k: [] for k in phases}
    snapshot = jailed._pool("jail", "nobody").checkers[0].snapshot
    for _ in range(runs):
        rows: dict[str, list[float]] = {k: [] for k in phases}
        for pred, gold in SYMBOLIC * repeats:
            t = time.perf_counter()
            value = _symbolic(pred, gold)
            rows["total_s"].append(time.perf_counter() - t)
            for k in ("wait_s", "run_s", "wall_s", "close_s"):
                rows[k].append(value[k])
            t = time.perf_counter()
            box = PythonSandbox(jailed.LIMITS)
            box.restore(snapshot)
            box.run("pass")
            box.close()
            rows["empty_s"].append(time.perf_counter() - t)
        for k in phases:
            out[k].append(statistics.median(rows[k]))
    return out


def throughput(runs: int, checks: int) -> dict[str, Any]:
    """Checks per second of symbolic pairs, from one thread and from two threads sharing the work."""
    work = [SYMBOLIC[i % len(SYMBOLIC)] for i in range(checks)]

    def rate(threads: int) -> float:
        parts = [work[i::threads] for i in range(threads)]
        workers = [threading.Thread(target=lambda part=part: [check_answer(*pair) for pair in part]) for part in parts]
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return checks / (time.perf_counter() - t)

    one, two = [], []
    for _ in range(runs):  # side by side in each run
        one.append(rate(1))
        two.append(rate(2))
    return {"checks": checks, "one_thread_per_s": one, "two_threads_per_s": two,
            "ratio": [b / a for a, b in zip(one, two)]}


def static_corpus(golds: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    hostile, rewarded = {}, []
    with tempfile.TemporaryDirectory() as markers:
        for kind, answers in hostile_answers.corpus(markers).items():
            runs = [(a, *_seconds(a, g)) for a in answers for g in golds]
            rewarded += [a[:80] for a, _, reward, _ in runs if reward != 0.0]
            worst = max(runs, key=lambda r: r[1])
            hostile[kind] = {"answers": len(answers), "checks": len(runs),
                             "median_ms": 1000 * statistics.median(r[1] for r in runs),
                             "max_ms": 1000 * worst[1], "worst": worst[0][:60],
                             "methods": sorted({r[3] for r in runs})}
        files = os.listdir(markers)
    return hostile, rewarded, files


def gold_classes(sample: int) -> dict[str, Any]:
    golds = [(env, g) for env, values in hostile_answers.bundled_golds().items() for g in values]
    rng = random.Random(0)
    out: dict[str, Any] = {}
    for kind in HOST_CLASSES + JAIL_CLASSES:
        applies = [(env, g, a) for env, g in golds if (a := hostile_answers.against(g)[kind])]
        tried = applies if kind in HOST_CLASSES else rng.sample(applies, min(sample, len(applies)))
        row = {"golds_applicable": len(applies), "golds_tried": len(tried), "answers": 0, "scored": 0,
               "golds_scored": 0, "golds_scored_math500": 0, "examples": []}
        t = time.perf_counter()
        for env, gold, answers in tried:
            hits = [a for a in answers if check_answer(a, gold)[0] != 0.0]
            row["answers"] += len(answers)
            row["scored"] += len(hits)
            if hits:
                row["golds_scored"] += 1
                row["golds_scored_math500"] += env == "math500"
                if len(row["examples"]) < 5:
                    row["examples"].append([env, gold, hits[0]])
        row["seconds"] = time.perf_counter() - t
        out[kind] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer runs, repeats and sampled golds")
    parser.add_argument("--runs", type=int, default=None, help="runs per timing (each reported as a range)")
    args = parser.parse_args()
    runs = args.runs or (2 if args.quick else 5)
    repeats, checks, sample, golds = (3, 24, 20, GOLDS[:1]) if args.quick else (7, 60, 60, GOLDS)
    t = time.perf_counter()
    jailed.start_checker()
    start_s = time.perf_counter() - t
    size = len(jailed.checker_pids())
    rows = typical(runs, repeats)
    prof = profile(runs, repeats)
    rates = throughput(runs, checks)
    hostile, rewarded, files = static_corpus(golds)
    classes = gold_classes(sample)
    load = os.getloadavg()[0]

    cores = len(os.sched_getaffinity(0))
    print(f"checkers: {size} (cores {cores}), built in {start_s:.1f} s; load average {load:.1f}; {runs} runs")
    print(f"\n{'typical answer':<50}{'median ms (range over runs)':>30}  method")
    for name, row in rows.items():
        print(f"{name:<50}{_span(row['median_ms_per_run']):>30}  {row['method']} ({row['reward']:g})")
    print(f"\n{'where a symbolic check goes (medians, ms)':<50}{'range over runs':>30}")
    for key, label in (("total_s", "the whole check (check_answer's jailed part)"), ("wait_s", "wait for a checker"),
                       ("run_s", "restore + cell"), ("wall_s", "  of which the check itself, in the cell"),
                       ("close_s", "close"), ("empty_s", "a restore with an empty cell, and its close")):
        print(f"{label:<50}{_span(prof[key], 1000):>30}")
    print(f"\n{'throughput (' + str(rates['checks']) + ' symbolic checks)':<50}{'range over runs':>30}")
    print(f"{'one thread, checks/s':<50}{_span(rates['one_thread_per_s']):>30}")
    print(f"{'two threads, checks/s':<50}{_span(rates['two_threads_per_s']):>30}")
    print(f"{'two threads / one thread':<50}{_span(rates['ratio'], digits=2):>30}")
    print(f"\n{'hostile class':<12}{'answers':>8}{'checks':>8}{'median ms':>11}{'max ms':>9}  worst")
    for kind, row in hostile.items():
        print(f"{kind:<12}{row['answers']:>8}{row['checks']:>8}{row['median_ms']:>11.1f}{row['max_ms']:>9.0f}  "
              f"{row['worst']!r}")
    print(f"rewarded hostile answers: {len(rewarded)}; files created by them: {len(files)}")
    print(f"\n{'built from a gold':<15}{'golds':>8}{'tried':>8}{'answers':>9}{'scored':>8}{'golds scored':>14}{'s':>7}")
    for kind, row in classes.items():
        print(f"{kind:<15}{row['golds_applicable']:>8}{row['golds_tried']:>8}{row['answers']:>9}{row['scored']:>8}"
              f"{row['golds_scored']:>14}{row['seconds']:>7.1f}")
    write_json("answers", {"machine": machine(), "load_average": load, "runs": runs, "checkers": size,
                           "checker_start_s": start_s, "typical": rows, "profile": prof, "throughput": rates,
                           "hostile": hostile, "rewarded": rewarded, "files": files, "built_from_golds": classes})
    print("\nwrote benchmarks/results/answers.json")


if __name__ == "__main__":
    main()
