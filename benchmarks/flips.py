"""Does prefix expansion find outcomes to flip? A fixed warm-started policy, continuations from the same roots.

Each step draws a candidate pool, allocates roots with trace's root stage, plays the bare rollouts once, then
plans stage 2 once per allocator of ``PLANS`` on those same bare trees: trace (active prefixes, the paper's
greedy on 1 - q^k), active_uniform (each continuation to a uniformly random open prefix), trace_root (an
agreeing prompt's root as one more anchor) and trace_root_uniform (uniform over those same anchors), and
trace_plus (trace_root with the refund to stage 1, whose refunded roots run too). Every plan runs, into the
same trees; each plan's continuations are told apart by node id, so every anchor is scored on its own plan's
continuations only. An
anchor (a depth >= 1 prefix that received k continuations) *flipped* when at least one continuation ended
with the other outcome than the bare rollout it lies on. Reported per task and plan: the share of anchors that
flipped, the share of continuations that did, the flips the predictor expected (Σ 1 - q^k with the values the
plan saw) against those realised, by depth and tier. The predictor is fit after each step on everything
collected (the policy never changes), so later steps show a warmer predictor.

The benchmark of docs/results.md is meaningful only where the realised share is well above zero: on the
Arithmetic tiers (the decision taken at turn 1) it was 1.1%; the chain task places the decision after the
first call.

Writes benchmarks/results/flips[_quick].json; prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import BENCH_RUNS, fmt, machine, mean_ci, train_config, warm_model, write_json
from learning import CALIBRATED, ENV, LEARNABLE, QUICK_WARM, TIERS, WARM_OVERRIDES

# The Arithmetic tiers (the earlier setting, where the habit of guessing without the tool is taken at turn 1).
# guess: one operator on 1-2 digits; tool: two on 1 digit; hard: five on 3 digits, never solved.
ARITHMETIC_TIERS = {"guess": {"share": 0.3, "min_ops": 1, "max_ops": 1, "min_digits": 1, "max_digits": 2},
                    "tool": {"share": 0.35, "min_ops": 2, "max_ops": 2, "min_digits": 1, "max_digits": 1},
                    "hard": {"share": 0.35, "min_ops": 5, "max_ops": 5, "min_digits": 3, "max_digits": 3}}
_SFT_TIERS = {k: {**ARITHMETIC_TIERS[k], "share": 0.5} for k in ("guess", "tool")}
# Per task: the runs/bench folder of its warm start, the env, its tiers, the learnable tiers, other env settings
# and the warm start's overrides (SFT on the learnable tiers, the expert's habit).
TASKS: dict[str, dict[str, Any]] = {
    "tiers": {"name": "arithmetic-tiers", "env": "trace/Arithmetic-v0", "tiers": ARITHMETIC_TIERS,
              "learnable": ("guess", "tool"), "env_kwargs": {"word_fraction": 0.0}, "overrides": [],
              "warm_overrides": ["env.kwargs=" + json.dumps({"n_tasks": 2000, "task_seed": 0, "word_fraction": 0.0,
                                                             "tiers": _SFT_TIERS}),
                                 "sft.expert=" + json.dumps({"guess": 0.5, "guess_tiers": ["guess"]})]},
    "chain": {"name": "chain-tiers", "env": ENV, "tiers": TIERS, "learnable": LEARNABLE, "env_kwargs": {},
              "overrides": [], "warm_overrides": WARM_OVERRIDES},
}

PLANS = ("trace", "active_uniform", "trace_root", "trace_root_uniform", "trace_plus")


def anchor_records(trees: dict[str, Any], plan: Any, first_new: dict[str, int], tiers: dict[str, str],
                   name: str) -> list[dict[str, Any]]:
    """One record per depth >= 1 anchor of ``plan``: depth, tier, the bare reward r, the value v the plan saw,
    k, and the outcomes of its continuations (the anchor's children created by this plan: ids >= first_new)."""
    from trace_gym.training.allocation.solvers import prefix_utility

    out = []
    for c in plan.prefixes:
        if not c.continuations:
            continue
        tree = trees[c.task_id]
        node = tree[c.node_id]
        kids = [k for k in node.children if first_new[c.task_id] <= k]
        outcomes = [float(leaf.reward > 0) for k in kids for leaf in tree.leaves(k)]
        v = c.value if c.value is not None else float("nan")
        out.append({"plan": name, "task_id": c.task_id, "tier": tiers.get(c.task_id, ""), "depth": node.depth,
                    "r": c.reward, "v": v, "k": c.continuations, "outcomes": outcomes,
                    "flipped": any(o != (c.reward > 0) for o in outcomes),
                    "expected": float(prefix_utility(c.reward, min(max(v, 0.0), 1.0), c.continuations))
                    if np.isfinite(v) else float("nan")})
    return out


def flip_step(trainer: Any, step: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One step at the fixed policy: trace's roots, bare rollouts, every plan on the same bare trees; returns the
    anchors' records and the refund's (expected mixed prompts against those realised)."""
    from trace_gym.seeds import derive, generator
    from trace_gym.training.allocation.allocators import make_allocator
    from trace_gym.training.allocation.stages import allocate_roots, fit_predictor, plan_continuations
    from trace_gym.training.variants import VariantAllocator

    cfg = trainer.cfg
    pool = trainer.stream.take(cfg.alloc.pool_size)
    tiers = {t.id: str(t.meta.get("tier", "")) for t in pool}
    rng = generator(cfg.seed, step)
    values = trainer.predictor.predict
    roots = allocate_roots(make_allocator("trace", cfg.alloc.group_size, cfg.alloc.cap), values, pool,
                           trainer.budget, rng)
    collector = trainer.collector
    collector.begin_step()
    collector.bare_rollouts(roots.counts, seed=derive(cfg.seed, step, 0))
    plans, refund = {}, None
    for name in PLANS:
        allocator = make_allocator(name, cfg.alloc.group_size, cfg.alloc.cap)
        if isinstance(allocator, VariantAllocator):  # root anchors, the refund
            plans[name], refunded_by = allocator.plan(values, collector.trees, roots, trainer.budget, rng)
            refund = refunded_by if allocator.refund else refund
        else:
            plans[name] = plan_continuations(allocator, values, collector.trees, roots, trainer.budget, rng)
    records = []
    for i, (name, plan) in enumerate(plans.items()):
        first_new = {tid: len(tree) for tid, tree in collector.trees.items()}
        collector.continuations(plan.counts(), seed=derive(cfg.seed, step, 1 + i))
        records += anchor_records(collector.trees, plan, first_new, tiers, name)
    refunded = {"step": step, "rollouts": 0, "prompts": 0, "expected_mixed": 0.0, "mixed": 0, "cost": 0.0}
    if refund is not None and refund.counts:
        collector.bare_rollouts(refund.counts, seed=derive(cfg.seed, step, 1 + len(plans)))
        trees = collector.trees
        refunded.update(rollouts=sum(refund.counts.values()), prompts=len(refund.counts), expected_mixed=refund.gain,
                        mixed=sum(trees[tid].is_mixed() for tid in refund.counts), cost=refund.cost)
    fit_predictor(trainer.predictor, list(collector.trees.values()), target=cfg.predictor.target)
    return [{**r, "step": step} for r in records], refunded


def flip_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from trace_gym.training.driver.trainer import Trainer

    torch.set_num_threads(job["threads"])
    task = TASKS[job["task"]]
    run_dir = BENCH_RUNS / task["name"] / "flips" / f"seed-{job['seed']}"
    kwargs = {"n_tasks": job["tasks"], "task_seed": 0, **task["env_kwargs"], "tiers": task["tiers"]}
    cfg = train_config(task["env"], run_dir, [
        f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}", f"env.kwargs={json.dumps(kwargs)}",
        f"alloc.roots={job['roots']}", f"alloc.multiplier={job['multiplier']}", f"alloc.pool_size={job['pool']}",
        "eval.tasks=0", "env.workers=1", "log.save_trees=none", *task["overrides"],
        *(CALIBRATED if job["calibrated"] else [])])
    trainer = Trainer(cfg)
    try:
        steps = [flip_step(trainer, s + 1) for s in range(job["steps"])]
    finally:
        trainer.close()
    return {"records": [r for rows, _ in steps for r in rows], "refunds": [refund for _, refund in steps]}


def flip_share(rows: list[dict[str, Any]]) -> float:
    """Share of anchors at least one of whose continuations ended with the other outcome."""
    return float(np.mean([r["flipped"] for r in rows])) if rows else float("nan")


def continuation_flip_share(rows: list[dict[str, Any]]) -> float:
    """Share of continuations that ended with the other outcome than their anchor's rollout."""
    flips = [o != (r["r"] > 0) for r in rows for o in r["outcomes"]]
    return float(np.mean(flips)) if flips else float("nan")


def grouped(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Pooled counts and shares per value of ``key`` (depth, tier, step)."""
    by: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r[key]].append(r)
    return {str(k): {"anchors": len(v), "continuations": int(sum(r["k"] for r in v)),
                     "flipped": int(sum(r["flipped"] for r in v)),
                     "expected": float(np.nansum([r["expected"] for r in v])),
                     "anchor_share": flip_share(v), "continuation_share": continuation_flip_share(v)}
            for k, v in sorted(by.items())}


def summarise(records: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """Per plan: shares over seeds (mean ± 95% t), and pooled rows by depth, tier and step."""
    out: dict[str, Any] = {}
    for plan in PLANS:
        every = [r for r in records if r["plan"] == plan]
        rows = [r for r in every if r["depth"] >= 1]  # the prefix anchors; roots (trace_root's) apart
        roots = [r for r in every if r["depth"] == 0]
        per_seed = [[r for r in rows if r["seed"] == s] for s in range(seeds)]
        half = max((r["step"] for r in rows), default=0) // 2
        out[plan] = {"anchor_share": mean_ci([flip_share(rs) for rs in per_seed]),
                     "continuation_share": mean_ci([continuation_flip_share(rs) for rs in per_seed]),
                     "anchor_share_second_half": mean_ci([flip_share([r for r in rs if r["step"] > half])
                                                          for rs in per_seed]),
                     "anchors_per_step": mean_ci([len(rs) / max(1, len({r["step"] for r in rs})) for rs in per_seed]),
                     "flipped": int(sum(r["flipped"] for r in rows)),
                     "expected": float(np.nansum([r["expected"] for r in rows])), "anchors": len(rows),
                     "continuations": int(sum(r["k"] for r in rows)), "by_depth": grouped(every, "depth"),
                     "root_anchors": len(roots), "root_anchor_share": flip_share(roots),
                     "root_anchor_expected": float(np.nansum([r["expected"] for r in roots])),
                     "by_tier": grouped(rows, "tier"), "by_step": grouped(rows, "step")}
    return out


def print_summary(task: str, s: dict[str, Any]) -> None:
    print(f"\n{task}: depth >= 1 anchors that flipped (share of anchors; of continuations), expected vs realised")
    for plan, g in s.items():
        if plan == "refund":
            print(f"  trace_plus refund: {g['rollouts']:.0f} root rollouts on {g['prompts']:.0f} prompts, mixed "
                  f"{g['mixed']:.0f} (expected {g['expected_mixed']:.1f}; the continuations given up expected "
                  f"{g['cost']:.1f} flips)")
            continue
        print(f"  {plan:8s} anchors {fmt(g['anchor_share'])} (second half {fmt(g['anchor_share_second_half'])}), "
              f"continuations {fmt(g['continuation_share'])}; {g['flipped']} of {g['anchors']} anchors "
              f"({g['continuations']} continuations) flipped, predictor expected {g['expected']:.0f}; "
              f"root anchors {g['root_anchors']} (flip share {g['root_anchor_share']:.2f}, "
              f"expected {g['root_anchor_expected']:.0f})")
        for key in ("by_depth", "by_tier"):
            print("    " + key[3:] + ": " + ", ".join(f"{k}: {v['flipped']}/{v['anchors']} (exp {v['expected']:.0f})"
                                                      for k, v in g[key].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="chain only, 1 seed, 2 steps of 32 roots, a 40-step warm start (the figures mean nothing)")
    parser.add_argument("--tasks-set", nargs="*", default=None, choices=sorted(TASKS), dest="task_names")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--roots", type=int, default=64, help="M root rollouts per step (N = 1 continuation each)")
    parser.add_argument("--calibrated", action="store_true",
                        help="the TRACE variants' predictor (learning.CALIBRATED) instead of the default")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from concurrent.futures import ProcessPoolExecutor

    seeds = args.seeds or (1 if args.quick else 2)
    steps = args.steps or (2 if args.quick else 6)
    roots = 32 if args.quick else args.roots
    names = args.task_names or (["chain"] if args.quick else sorted(TASKS))
    start = time.perf_counter()
    result: dict[str, Any] = {"settings": {"seeds": seeds, "steps": steps, "roots": roots, "multiplier": 1,
                                           "pool": 64, "tasks": 256, "calibrated": args.calibrated}}
    for name in names:
        model = warm_model(TASKS[name]["env"], TASKS[name]["name"] + ("-quick" if args.quick else ""),
                           [*TASKS[name]["warm_overrides"], *(QUICK_WARM if args.quick else [])])
        jobs = [{"task": name, "seed": s, "steps": steps, "roots": roots, "multiplier": 1, "pool": 64, "tasks": 256,
                 "model": model, "threads": max(1, 2 // args.workers), "calibrated": args.calibrated}
                for s in range(seeds)]
        with ProcessPoolExecutor(args.workers) as ex:
            done = list(ex.map(flip_job, jobs))
        records = [{**r, "seed": job["seed"]} for job, out in zip(jobs, done) for r in out["records"]]
        result[name] = summarise(records, seeds)
        refunds = [r for out in done for r in out["refunds"]]
        result[name]["refund"] = {k: float(np.sum([r[k] for r in refunds]))
                                  for k in ("rollouts", "prompts", "expected_mixed", "mixed", "cost")}
        print_summary(name, result[name])
    payload = {"machine": machine(), "seconds": time.perf_counter() - start, "flips": result}
    path = write_json(("flips_quick" if args.quick else "flips") + ("_calibrated" if args.calibrated else ""),
                      payload)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
