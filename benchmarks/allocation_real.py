"""(b) of the allocation benchmark: the trainer's rollout half (`Trainer.rollout`: the shared step) with the
warm-started tiny model held fixed on real envs, and how the env's prompts spread over success probability
at that policy (see allocation.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _common import BENCH_RUNS, COPYING, ci_bars, env_short, fmt, mean_ci, pyplot, train_config, warm_model
from allocation_sim import finite_mean, metric_row, summarise

# active + active; uniform_active and active_uniform change one stage each.
REAL_ALLOCATORS = ("grpo", "pcl", "treepo", "uniform_active", "active_uniform", "trace", "trace_adaptive")
# name -> (env id, config overrides). The warm start is always the env's own (benchmarks/_common.py); level 2
# (1-2 operators, 1-2 digits) is partly outside the SFT data (2-3 operators), so at the warm-started policy
# most prompts sit near 0 or 1, the regime of the paper (GRPO's effective ratio 26.8%), while at level 3 most
# prompts are mixed even in groups of 8.
REAL_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Arithmetic": ("trace/Arithmetic-v0", ()),
    "Arithmetic level 2": ("trace/Arithmetic-v0",
                           ("env.kwargs={n_tasks: 2000, task_seed: 0, difficulty: 2, word_fraction: 0.0}",)),
    "HotpotQA": ("trace/HotpotQA-v0", ()),
}


def allocation_step(trainer: Any, step: int) -> dict[str, Any]:
    """The trainer's rollout half (allocate, roll out, expand, fit the predictor); the policy stays fixed."""
    from trace_gym.tree_stats import tree_values

    result = trainer.rollout(step)
    m = result.metrics
    row: dict[str, Any] = metric_row(m)  # brier_true stays NaN: no exact values on real envs
    row["brier"] = float(m.get("predictor/brier", float("nan")))  # against the step's bottom-up targets
    row["root_rank_corr"] = float(m.get("predictor/root_rank_corr", float("nan")))  # does it rank the prompts?
    # per prompt: the mean leaf reward (grpo: G rollouts)
    row["prompt_success"] = [float(tree_values(t)[0][0]) for t in result.trees.values()]
    return row


def difficulty(runs: list[list[dict[str, Any]]], group: int, pool: int, roots: int, cap: int) -> dict[str, Any]:
    """From grpo's groups of ``group`` rollouts per prompt: how the env's prompts spread over success
    probability at the fixed policy, the per-prompt effective ratio that spread implies for 2 rollouts per
    prompt (trace's smallest root share) and for ``group`` (grpo), and what trace's root stage would reach
    with exact values (`exact_roots_effective`). Explains real-env effective ratios."""
    p = np.array([v for rows in runs for r in rows for v in r["prompt_success"]], dtype=np.float64)
    return {"prompts": len(p), "all_fail": float(np.mean(p == 0)), "all_success": float(np.mean(p == 1)),
            "mixed": float(np.mean((p > 0) & (p < 1))), "mean_success": float(p.mean()),
            "histogram": np.histogram(p, bins=np.linspace(0, 1, group + 2))[0].tolist(),
            "expected_effective_2": float(np.mean(1 - p**2 - (1 - p) ** 2)),
            f"expected_effective_{group}": float(np.mean(1 - p**group - (1 - p) ** group)),
            "exact_roots_effective": exact_roots_effective(p, pool, roots, cap)}


def exact_roots_effective(p: np.ndarray, pool: int, roots: int, cap: int, draws: int = 200) -> dict[str, float]:
    """Trace's root stage fed exact values, on pools drawn from the measured per-prompt successes ``p``
    (a plug-in: each prompt's success is its grpo group's mean): the expected per-prompt effective ratio of
    the root rollouts alone (continuations only add to it) and the expected mixed prompts per step."""
    from trace_gym.training.allocation.solvers import root_utility, solve_roots

    rng = np.random.default_rng(0)
    ratios, mixed, chosen = [], [], []
    for _ in range(draws):
        v = rng.choice(p, size=min(pool, len(p)), replace=False)
        m = solve_roots(v, roots, cap)
        u = root_utility(v[m > 0], m[m > 0])
        ratios.append(float(u.mean()))
        mixed.append(float(u.sum()))
        chosen.append(int((m > 0).sum()))
    return {"ratio": float(np.mean(ratios)), "mixed_prompts": float(np.mean(mixed)),
            "prompts": float(np.mean(chosen))}


def _real_job(job: tuple[str, str, str, int, int, tuple[str, ...], str]) -> list[dict[str, float]]:
    """One allocator and seed on a real env: `steps` allocation steps at the fixed warm-started policy."""
    import torch

    from trace_gym.training.driver.trainer import Trainer

    case, env_id, allocator, seed, steps, overrides, model = job
    torch.set_num_threads(1)
    run_dir = BENCH_RUNS / env_short(env_id) / "alloc" / re.sub(r"\W+", "-", case.lower()) / f"{allocator}-{seed}"
    cfg = train_config(env_id, run_dir, [f"model.path={model}", "sft.enabled=false", f"seed={seed}",
                                         f"alloc.allocator={allocator}", "eval.tasks=0", "env.workers=1",
                                         *overrides], COPYING)
    trainer = Trainer(cfg)
    try:
        return [allocation_step(trainer, s + 1) for s in range(steps)]
    finally:
        trainer.close()


def real_env(case: str, allocators: Sequence[str], seeds: int, steps: int, overrides: Sequence[str],
             workers: int) -> dict[str, Any]:
    """Each allocator on the real-env ``case`` at the fixed warm-started tiny model, several seeds."""
    env_id, own = REAL_CASES[case]
    model = warm_model(env_id, config=COPYING)
    jobs = [(case, env_id, a, s, steps, (*own, *overrides), model) for a in allocators for s in range(seeds)]
    with ProcessPoolExecutor(workers) as ex:
        done = list(ex.map(_real_job, jobs, chunksize=1))
    out: dict[str, Any] = {}
    for a in allocators:
        runs = [rows for (_, _, name, *_), rows in zip(jobs, done) if name == a]
        out[a] = summarise(runs)
        for key in ("brier", "root_rank_corr"):
            out[a][key] = mean_ci([finite_mean([r[key] for r in rows[len(rows) // 2:]]) for rows in runs])
        print(f"  {case} {a}: effective ratio {fmt(out[a]['effective_ratio'])}", flush=True)
    grpo = [rows for (_, _, name, *_), rows in zip(jobs, done) if name == "grpo"]
    budget = train_config(env_id, BENCH_RUNS, [*own, *overrides], COPYING).alloc
    spread = difficulty(grpo, budget.group_size, budget.pool_size, budget.roots, budget.cap) if grpo else None
    if spread:
        print(f"  {case} prompts at the fixed policy (grpo groups of {budget.group_size}): {spread}", flush=True)
    return {"case": case, "env": env_id, "model": model, "seeds": seeds, "steps": steps,
            "overrides": [*own, *overrides], "allocators": out, "difficulty": spread}


def plot_real(real: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(real), figsize=(5.5 * len(real), 3.8), squeeze=False)
    for ax, r in zip(axes[0], real):
        exact = (r.get("difficulty") or {}).get("exact_roots_effective")
        if exact:  # drawn first so that ci_bars' legend lists it
            ax.axhline(exact["ratio"], color="gray", ls="--", lw=1, label="trace roots, exact values")
        ci_bars(ax, r["allocators"], (("effective_ratio", "tab:blue"), ("effective_ratio_sample", "tab:orange")),
                rotation=30, fontsize=7)
        ax.set_title(f"{r['case']}, tiny model, {r['seeds']} seeds x {r['steps']} steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


