"""TRACE against its baselines at equal trajectory budget, on the simulation env (exact values known).

For every allocator (grpo, pcl, treepo, the four uniform/active stage combinations, trace, oracle) and many
seeds: effective ratio (per prompt, per sample), mixed prompts per step, contrastive sibling pairs per
trajectory and per 1k generated tokens, generated tokens, and the predictor's Brier score against the exact
success probabilities. The oracle is trace fed the exact values: it bounds what any allocator can reach.

Diagnostics (why trace falls short of the oracle) run the same loop with one thing changed at a time:
exact values for one stage only, a predictor that knows everything the prompt text can tell (the task
generator's posterior, no memorisation), the learned predictor also fit on a free uniform batch each step
(removes selection bias without spending budget), an exploration fraction of the root budget, and uniform
roots in groups of 2 (as many prompts as grpo; the default groups of 8 give tree baselines 4 prompts).

Part (b) runs the trainer's own stages with the warm-started tiny model held fixed on real envs (the cases
of REAL_CASES: Arithmetic in and out of the warm start's distribution, and HotpotQA; none with --quick), and
reports how the env's prompts spread over success probability at that policy (from grpo's groups of 8),
which decides what any allocator can reach there.

The two parts live in allocation_sim.py and allocation_real.py; both run the trainer's step
(`training.step.take_step`). Numbers are means over the second half of each run's steps (after the
predictor's warm-up), then mean and 95% t-interval over seeds. Writes benchmarks/results/allocation[_quick].json,
allocation_sim.png and allocation_real.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import DOCS_IMG, RESULTS, fmt, machine, write_json
from allocation_real import REAL_ALLOCATORS, REAL_CASES, plot_real, real_env
from allocation_sim import plot_sim, simulate


def print_table(title: str, rows: dict[str, Any]) -> None:
    cols = ["effective_ratio", "effective_ratio_sample", "mixed_prompts", "pairs_per_trajectory",
            "pairs_per_1k_tokens", "tokens", "success"]
    cols.append("brier" if "brier" in next(iter(rows.values())) else "brier_true")
    width = max(map(len, rows)) + 2
    print(f"\n{title}")
    print(" " * width + "".join(f"{c[:22]:>24s}" for c in cols))
    for label, r in rows.items():
        print(f"{label:{width}s}" + "".join(f"{fmt(r[c], 1 if c in ('tokens', 'pairs_per_1k_tokens') else 3):>24s}"
                                        for c in cols))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 seeds x 16 steps, fewer diagnostics (~2 min)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-diagnostics", action="store_true")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulation (part a)")
    parser.add_argument("--real", nargs="*", default=None, metavar="CASE", choices=list(REAL_CASES),
                        help="(b) real-env cases with the warm-started tiny model (built and SFT'd once, cached "
                             f"under runs/bench); default all of {list(REAL_CASES)}, none with --quick")
    parser.add_argument("--real-seeds", type=int, default=4)
    parser.add_argument("--real-steps", type=int, default=8)
    parser.add_argument("--real-set", nargs="*", default=["alloc.roots=32", "alloc.multiplier=1",
                                                          "alloc.pool_size=64", "alloc.cap=8"],
                        help="trainer config overrides for part (b)")
    parser.add_argument("--tasks", type=int, default=512, help="tasks the pools are drawn from")
    parser.add_argument("--pool", type=int, default=128, help="candidate prompts per step")
    parser.add_argument("--out", default=None, help="result name (default allocation or allocation_quick)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = args.seeds or (3 if args.quick else 8)
    steps = args.steps or (16 if args.quick else 30)
    start = time.perf_counter()
    name = args.out or ("allocation_quick" if args.quick else "allocation")
    payload: dict[str, Any] = {"machine": machine()}
    if not args.no_sim:
        sim = simulate(args.quick, seeds, steps, args.workers, tasks=args.tasks, pool=args.pool,
                       diagnostics=not args.no_diagnostics)
        print_table("simulation: allocators at equal budget", sim["allocators"])
        if sim["diagnostics"]:
            print_table("simulation: diagnostics (one change each)", sim["diagnostics"])
        payload["simulation"] = sim
    real = args.real if args.real is not None else ([] if args.quick else list(REAL_CASES))
    payload["real"] = [real_env(case, REAL_ALLOCATORS, args.real_seeds, args.real_steps, args.real_set,
                                args.workers) for case in real]
    for r in payload["real"]:
        print_table(f"{r['case']} ({r['env']}): tiny model, fixed policy, {r['seeds']} seeds x {r['steps']} steps",
                    r["allocators"])
    payload["seconds"] = time.perf_counter() - start
    path = write_json(name, payload, args.results_dir)
    pngs = []
    if "simulation" in payload:
        pngs.append(args.results_dir / f"{name}_sim.png")
        plot_sim(payload["simulation"], pngs[-1])
    if payload["real"]:
        pngs.append(args.results_dir / f"{name}_real.png")
        plot_real(payload["real"], pngs[-1])
    print(f"\nwrote {path} and {', '.join(map(str, pngs))} in {payload['seconds']:.0f} s")
    if not args.quick and args.out is None and args.results_dir == RESULTS:  # the default run: the docs' plots
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        for png in pngs:
            part = png.stem.rsplit("_", 1)[-1]  # sim or real
            (DOCS_IMG / f"allocation_{part}.png").write_bytes(png.read_bytes())


if __name__ == "__main__":
    main()
