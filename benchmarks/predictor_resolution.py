"""A predictor with resolution, judged twice (docs/results.md, "A predictor with resolution").

1. At the chain task's fixed warm start: realised over predicted flips of the default predictor and of the
   resolution setting (log-prob and tier features, the flip scale), side by side on the same bare rollouts. This
   script reads them from the flips benchmark's output, which it does not run:
       .venv/bin/python benchmarks/flips.py --tasks-set chain --predictors default resolution
2. In the simulation (`allocation_sim.resolution_run`): stage 2's expected flips under the exact values as a share
   of the plan the exact values choose, on the same bare rollouts, for trace and trace_root with each setting of
   `allocation_sim.RESOLUTION_SETTINGS`. The simulation records each move's log-probability, which carries the
   task's success probability exactly (simulation.py, choice 4): the best case for the log-prob features.

Writes docs/data/predictor_resolution.json (the simulation's rows and the flips benchmark's ratios) and prints
both tables.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _common import RESULTS, fmt, machine, write_json
from allocation_sim import RESOLUTION_SETTINGS, resolution_run, summarise_resolution

DOCS_DATA = Path(__file__).parent.parent / "docs" / "data"
FLIP_KEYS = ("anchors", "flipped", "expected", "expected_scaled", "ratio", "ratio_scaled", "ratio_per_seed",
             "ratio_scaled_per_seed", "ratio_scaled_after_step_1", "anchor_share", "root_anchors",
             "root_anchor_share", "root_anchor_expected")


def _job(args: tuple[int, dict[str, int]]) -> list[dict[str, float]]:
    seed, cfg = args
    return resolution_run(seed, cfg)


def flip_ratios(path: Path) -> dict[str, Any]:
    """The flips benchmark's settings and, per task, predictor setting and plan, the figures of ``FLIP_KEYS``."""
    flips = json.loads(path.read_text())
    out: dict[str, Any] = {"source": path.name, "seconds": flips["seconds"], "settings": flips["flips"]["settings"]}
    for task, by_predictor in flips["flips"].items():
        if task == "settings":
            continue
        out[task] = {p: {plan: g if plan == "refund" else {k: g[k] for k in FLIP_KEYS} for plan, g in plans.items()}
                     for p, plans in by_predictor.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--flips", type=Path, default=RESULTS / "flips_resolution.json",
                        help="the flips benchmark's output with --predictors default resolution")
    parser.add_argument("--keep-simulation", action="store_true",
                        help="take the simulation's part from the JSON this script wrote last, rather than run it")
    args = parser.parse_args()
    start = time.perf_counter()
    cfg = {"tasks": 512, "pool": 128, "roots": 32, "multiplier": 3, "horizon": 4, "steps": args.steps}
    kept = json.loads((DOCS_DATA / "predictor_resolution.json").read_text()) if args.keep_simulation else None
    if kept is not None:
        sim, cfg = kept["simulation"]["rows"], kept["simulation"]["settings"]
        args.seeds, args.steps = cfg["seeds"], cfg["steps"]
    else:
        with ProcessPoolExecutor(args.workers) as ex:
            runs = list(ex.map(_job, [(seed, cfg) for seed in range(args.seeds)]))
        sim = summarise_resolution(runs)
    print(f"simulation, stage 2 against the oracle's on the same bare rollouts ({args.seeds} seeds x {args.steps} "
          "steps, second half): share of the oracle's expected flips; realised / predicted (/ with the flip scale)")
    for key, row in sim.items():
        print(f"  {key:22s} {fmt(row['fraction_of_oracle'])}   {row['realised_over_predicted']:.2f}"
              f"   ({row['realised_over_scaled']:.2f})")
    payload: dict[str, Any] = {"machine": machine(), "simulation": kept["simulation"] if kept is not None else {
        "settings": {**cfg, "seeds": args.seeds, "settings": {k: {"logprob_features": lp, "flip_scale": sc}
                                                             for k, (lp, sc) in RESOLUTION_SETTINGS.items()}},
        "seconds": time.perf_counter() - start, "rows": sim}}
    if args.flips.exists():
        payload["flips"] = flip_ratios(args.flips)
        for task in (t for t in payload["flips"] if t not in ("source", "seconds", "settings")):
            print(f"\n{task} at the fixed warm start: flipped / predicted (realised over predicted; with the scale)")
            for p, plans in payload["flips"][task].items():
                for plan, g in plans.items():
                    if plan != "refund" and g["expected"]:
                        print(f"  {p:10s} {plan:18s} {g['flipped']} / {g['expected']:.0f} ({g['ratio']:.2f}); "
                              f"{g['flipped']} / {g['expected_scaled']:.0f} ({g['ratio_scaled']:.2f})")
    else:
        print(f"\n{args.flips} not found: run flips.py --tasks-set chain --predictors default resolution first")
    path = write_json("predictor_resolution", payload, DOCS_DATA)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
