"""Learning at equal budget: held-out success against trajectories spent, tiny model on trace/Arithmetic-v0.

Every run starts from the same warm-started (SFT) tiny model and spends the same trajectories per step
(``alloc.roots`` x (1 + ``alloc.multiplier``)); runs differ only in the allocator (grpo, pcl, treepo,
trace) and the seed (data order, sampling). A second sweep keeps trace and the total fixed and changes the
budget shape, roots M x continuations N (the paper's Table 2 at small scale). Evaluation: sampled success
(T = 1, 2 samples per prompt, as in the quickstart config) on held-out prompts (another task seed) every
``eval.every`` steps.

Writes benchmarks/results/learning[_quick].json and learning.png; prints tables with 95% intervals over seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import (
    BENCH_RUNS,
    DOCS_IMG,
    RESULTS,
    ci_bars,
    fmt,
    machine,
    mean_ci,
    pyplot,
    train_config,
    warm_model,
    write_json,
)

ENV = "trace/Arithmetic-v0"


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One training run from the shared warm start; returns the trainer's summary and its eval curve."""
    import torch

    from trace_gym.training.trainer import Trainer

    torch.set_num_threads(1)
    run_dir = BENCH_RUNS / "arithmetic" / "learn" / job["tag"] / f"{job['allocator']}-{job['seed']}"
    overrides = [f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}",
                 f"alloc.allocator={job['allocator']}", f"alloc.roots={job['roots']}",
                 f"alloc.multiplier={job['multiplier']}", f"steps={job['steps']}", f"eval.every={job['eval_every']}",
                 f"eval.tasks={job['eval_tasks']}", "checkpoint.every=0", "checkpoint.keep=1",
                 f"alloc.pool_size={job['pool']}", "alloc.cap=8", "env.workers=1"]
    trainer = Trainer(train_config(ENV, run_dir, overrides))
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    return {**job, "summary": summary, "curve": [[s * job["roots"] * (1 + job["multiplier"]), v]
                                                  for s, v in summary["eval"]]}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per group: final success, gain over the warm start, mean effective ratio (mean ± 95% CI over seeds)."""
    points = sorted({p[0] for r in runs for p in r["curve"]})
    curve = [{"trajectories": t, **mean_ci([p[1] for r in runs for p in r["curve"] if p[0] == t])} for t in points]
    s = [r["summary"] for r in runs]
    return {"success_before": mean_ci([x["success_before"] for x in s]),
            "success_after": mean_ci([x["success_after"] for x in s]),
            "gain": mean_ci([x["success_after"] - x["success_before"] for x in s]),
            "effective_ratio": mean_ci([x["effective_ratio_mean"] for x in s]),
            "trajectories": mean_ci([x["trajectories"] for x in s]),
            "generated_tokens": mean_ci([x["generated_tokens"] for x in s]),
            "wall_s": mean_ci([x["wall_s"] for x in s]), "curve": curve, "seeds": len(runs)}


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, g in result["allocators"].items():
        t = np.array([p["trajectories"] for p in g["curve"]])
        m = np.array([p["mean"] for p in g["curve"]])
        ci = np.nan_to_num(np.array([p["ci95"] if p["ci95"] is not None else np.nan for p in g["curve"]], float))
        ax1.plot(t, m, marker="o", label=name)
        ax1.fill_between(t, m - ci, m + ci, alpha=0.15)
    ax1.set_xlabel("trajectories spent")
    ax1.set_ylabel("held-out success (T=1, 2 samples/prompt)")
    ax1.set_title(f"{ENV}, tiny model, same warm start, {result['settings']['seeds']} seeds", fontsize=9)
    ax1.legend(fontsize=8)
    ci_bars(ax2, result["shapes"], (("success_after", "tab:green"), ("effective_ratio", "tab:blue")))
    ax2.set_title("trace, budget shape M roots x N continuations (equal total)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="grpo vs trace, 1 seed, 6 steps, 2 shapes")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--eval-tasks", type=int, default=None)
    args = parser.parse_args()
    quick = args.quick
    seeds = args.seeds or (1 if quick else 3)
    steps = args.steps or (6 if quick else 16)
    eval_every = 3 if quick else 4
    eval_tasks = args.eval_tasks or (50 if quick else 100)
    allocators = ("grpo", "trace") if quick else ("grpo", "pcl", "treepo", "trace")
    shapes = ((32, 1), (16, 3)) if quick else ((32, 1), (16, 3), (8, 7))  # equal total: 64 trajectories/step
    start = time.perf_counter()
    model = warm_model(ENV)
    base = {"model": model, "steps": steps, "eval_every": eval_every, "eval_tasks": eval_tasks, "pool": 64}
    jobs = [{**base, "tag": "alloc", "allocator": a, "seed": s, "roots": 32, "multiplier": 1}
            for a in allocators for s in range(seeds)]
    jobs += [{**base, "tag": f"shape{m}x{n}", "allocator": "trace", "seed": s, "roots": m, "multiplier": n}
             for m, n in shapes if (m, n) != (32, 1) for s in range(seeds)]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with ProcessPoolExecutor(args.workers) as ex:
        runs = list(ex.map(train_run, jobs))
    by_alloc = {a: aggregate([r for r in runs if r["tag"] == "alloc" and r["allocator"] == a]) for a in allocators}
    by_shape = {f"{m}x{n}": aggregate([r for r in runs if r["allocator"] == "trace" and r["roots"] == m
                                       and r["multiplier"] == n]) for m, n in shapes}
    result = {"settings": {"env": ENV, "seeds": seeds, "steps": steps, "trajectories_per_step": 64,
                           "eval_every": eval_every, "eval_tasks": eval_tasks, "pool": 64, "model": model},
              "allocators": by_alloc, "shapes": by_shape,
              "runs": [{k: v for k, v in r.items() if k != "model"} for r in runs]}
    cols = ("success_before", "success_after", "gain", "effective_ratio", "generated_tokens")
    for title, rows in (("allocators (M=32, N=1 or 64 flat)", by_alloc), ("trace budget shapes", by_shape)):
        print(f"\n{title}")
        print(f"{'':10s}" + "".join(f"{c:>22s}" for c in cols))
        for name, g in rows.items():
            print(f"{name:10s}" + "".join(f"{fmt(g[c], 0 if c == 'generated_tokens' else 3):>22s}" for c in cols))
    name = "learning_quick" if quick else "learning"
    payload = {"machine": machine(), "seconds": time.perf_counter() - start, "learning": result}
    path = write_json(name, payload)
    png = RESULTS / f"{name}.png"
    plot(result, png)
    print(f"\nwrote {path} and {png} in {payload['seconds']:.0f} s")
    if not quick:
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        (DOCS_IMG / "learning.png").write_bytes(png.read_bytes())


if __name__ == "__main__":
    main()
