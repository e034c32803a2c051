"""The paper's budget shapes at a fixed policy: the same 128 trajectories a step spent as 64 roots x (1 + 1),
32 x (1 + 3) or 16 x (1 + 7), with the paper's ``trace`` allocator on the arithmetic chains.

The policy is the learning experiment's committed warm start and is not updated (``Trainer.rollout``: allocate,
roll out, expand, fit the predictor), so this measures what each shape finds, not what it teaches. Per shape:
mixed prompts per step (prompts whose tree holds both outcomes), the effective ratio, depth >= 1 anchors and how
many flipped (a continuation ended with the other outcome than the rollout it branched from), and the generated
tokens per step. Mean ± 95% t-interval over seeds of the per-seed means over steps. Writes
benchmarks/results/budget_shapes.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import BENCH_RUNS, fmt, machine, mean_ci, train_config, write_json
from learning import DATA, ENV, TIERS

SHAPES = ((64, 1), (32, 3), (16, 7))  # M roots x N continuations per root: 128 trajectories each
KEYS = ("alloc/effective_ratio", "rollout/prompts", "alloc/prefix_anchors", "alloc/prefix_flips", "rollout/tokens",
        "rollout/trajectories")


def shape_job(job: dict[str, Any]) -> list[dict[str, float]]:
    """``job['steps']`` allocation steps of one (shape, seed) at the fixed policy; the step metrics of each."""
    import torch

    from trace_gym.training.driver.trainer import Trainer

    torch.set_num_threads(1)
    roots, multiplier = job["shape"]
    run_dir = BENCH_RUNS / "budget-shapes" / f"{roots}x{multiplier}-s{job['seed']}"
    kwargs = {"n_tasks": 256, "task_seed": 0, "tiers": TIERS}
    cfg = train_config(ENV, run_dir, [
        f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}", f"env.kwargs={json.dumps(kwargs)}",
        "alloc.allocator=trace", f"alloc.roots={roots}", f"alloc.multiplier={multiplier}", "alloc.pool_size=64",
        "eval.tasks=0", "env.workers=1", "log.save_trees=none", *job.get("overrides", [])])
    trainer = Trainer(cfg)
    try:
        return [{k: float(trainer.rollout(step).metrics.get(k, np.nan)) for k in KEYS}
                for step in range(1, job["steps"] + 1)]
    finally:
        trainer.close()


def summarise(steps: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Per-seed means over steps, then mean ± 95% t over seeds."""
    def per_seed(fn: Any) -> dict[str, float]:
        return mean_ci([float(np.nanmean([fn(m) for m in seed])) for seed in steps])

    flips = sum(m["alloc/prefix_flips"] for seed in steps for m in seed)
    anchors = sum(m["alloc/prefix_anchors"] for seed in steps for m in seed)
    return {"mixed_prompts": per_seed(lambda m: m["alloc/effective_ratio"] * m["rollout/prompts"]),
            "effective_ratio": per_seed(lambda m: m["alloc/effective_ratio"]),
            "prompts": per_seed(lambda m: m["rollout/prompts"]),
            "anchors": per_seed(lambda m: m["alloc/prefix_anchors"]),
            "flipped": per_seed(lambda m: m["alloc/prefix_flips"]),
            "flip_share": flips / anchors if anchors else float("nan"),
            "tokens": per_seed(lambda m: m["rollout/tokens"]),
            "trajectories": per_seed(lambda m: m["rollout/trajectories"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default=str(DATA / "warm_start"), help="the fixed policy (a model folder)")
    args = parser.parse_args()
    start = time.perf_counter()
    jobs = [{"shape": shape, "seed": s, "steps": args.steps, "model": args.model} for shape in SHAPES
            for s in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as ex:
        done = list(ex.map(shape_job, jobs))
    table = {f"{m}x{n}": summarise([d for j, d in zip(jobs, done) if j["shape"] == (m, n)]) for m, n in SHAPES}
    cols = ("mixed prompts", "effective ratio", "prompts", "anchors", "flipped", "flip share", "tokens")
    print(f"\n{'shape':8s}" + "".join(f"{c:>20s}" for c in cols))
    for shape, g in table.items():
        vals = [fmt(g["mixed_prompts"], 1), fmt(g["effective_ratio"]), fmt(g["prompts"], 1), fmt(g["anchors"], 1),
                fmt(g["flipped"], 1), f"{g['flip_share']:.3f}", fmt(g["tokens"], 0)]
        print(f"{shape:8s}" + "".join(f"{v:>20s}" for v in vals))
    path = write_json("budget_shapes", {"machine": machine(), "seconds": time.perf_counter() - start,
                                        "settings": vars(args), "shapes": table})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
