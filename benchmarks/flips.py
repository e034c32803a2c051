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

``--predictors`` runs several predictor settings side by side on the same bare rollouts (`PREDICTORS`): each
setting has its own predictor (fit after each step on everything collected) and runs every plan with its values.
``resolution`` adds the policy's log-probs and the task's tier to the text features
(``predictor.logprob_features``) and gives trace_root and trace_plus the flip scale (``alloc.flip_scale``). Every
setting measures a flip scale per plan on its own anchors, so that each record also carries the flips the scale
expected (``scaled``: 1 - q^k times the scale of its r before the step's outcomes were seen) next to the
predictor's own (``expected``).

Writes benchmarks/results/flips[_quick][_calibrated][_resolution].json; prints the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
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
# Per predictor setting: its config overrides, and whether the variants allocate with the flip scale.
PREDICTORS: dict[str, dict[str, Any]] = {
    "default": {"overrides": [], "flip_scale": False},
    "resolution": {"overrides": ["predictor.logprob_features=true"], "flip_scale": True},
}
FLIP_SCALE_PRIOR = 8.0  # alloc.flip_scale_prior's default


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
        out.append({"plan": name, "task_id": c.task_id, "node_id": c.node_id, "tier": tiers.get(c.task_id, ""),
                    "depth": node.depth,
                    "r": c.reward, "v": v, "k": c.continuations, "outcomes": outcomes,
                    "flipped": any(o != (c.reward > 0) for o in outcomes),
                    "expected": float(prefix_utility(c.reward, min(max(v, 0.0), 1.0), c.continuations))
                    if np.isfinite(v) else float("nan")})
    return out


@dataclass
class Setting:
    """One predictor setting of a run (`PREDICTORS`): its predictor, whether its variants allocate with their flip
    scale, and one flip scale per plan that reads values (measured for every setting, used only where
    ``flip_scale``)."""

    name: str
    predictor: Any
    flip_scale: bool
    scales: dict[str, Any]


def flip_step(trainer: Any, step: int, settings: list[Setting]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One step at the fixed policy: trace's roots (valued by the first setting's predictor), bare rollouts, then
    every setting's plans on the same bare trees; returns the anchors' records and each setting's refund
    (expected mixed prompts against those realised)."""
    from trace_gym.seeds import derive, generator
    from trace_gym.training.allocation.allocators import make_allocator
    from trace_gym.training.allocation.stages import allocate_roots, fit_predictor, plan_continuations
    from trace_gym.training.variants import VariantAllocator

    cfg = trainer.cfg
    pool = trainer.stream.take(cfg.alloc.pool_size)
    tiers = {t.id: str(t.meta.get("tier", "")) for t in pool}
    rng = generator(cfg.seed, step)
    roots = allocate_roots(make_allocator("trace", cfg.alloc.group_size, cfg.alloc.cap), settings[0].predictor.predict,
                           pool, trainer.budget, rng)
    collector = trainer.collector
    collector.begin_step()
    collector.bare_rollouts(roots.counts, seed=derive(cfg.seed, step, 0))
    plans, refunds = {}, {}
    for setting in settings:
        values = setting.predictor.predict
        for name in PLANS:
            allocator = make_allocator(name, cfg.alloc.group_size, cfg.alloc.cap)
            if isinstance(allocator, VariantAllocator):  # root anchors, the refund
                if setting.flip_scale and name in setting.scales:
                    allocator = dataclasses.replace(allocator, flip_scale=setting.scales[name])
                plans[setting.name, name], refunded_by = allocator.plan(values, collector.trees, roots,
                                                                        trainer.budget, rng)
                if allocator.refund:
                    refunds[setting.name] = refunded_by
            else:
                plans[setting.name, name] = plan_continuations(allocator, values, collector.trees, roots,
                                                               trainer.budget, rng)
    records = []
    for i, ((setting_name, name), plan) in enumerate(plans.items()):
        scale = next(s for s in settings if s.name == setting_name).scales.get(name)
        first_new = {tid: len(tree) for tid, tree in collector.trees.items()}
        collector.continuations(plan.counts(), seed=derive(cfg.seed, step, 1 + i))
        rows = anchor_records(collector.trees, plan, first_new, tiers, name)
        if scale is not None:  # the flips the scale expected, before it sees this plan's outcomes
            for r in rows:
                r["scaled"] = r["expected"] * float(scale([r["node_id"]], np.array([r["r"]]))[0])
            scale.expect(plan, first_new)
            scale.observe(collector.trees)
        records += [{**r, "predictor": setting_name} for r in rows]
    refunded = []
    for j, setting in enumerate(settings):
        row = {"step": step, "predictor": setting.name, "rollouts": 0, "prompts": 0, "expected_mixed": 0.0,
               "mixed": 0, "cost": 0.0}
        refund = refunds.get(setting.name)
        if refund is not None and refund.counts:
            # A prompt another setting's refund already started takes its rollouts from the root; each setting's
            # refunded prompts are judged mixed on its own new rollouts only.
            first_new = {tid: len(tree) for tid, tree in collector.trees.items()}
            started = {tid: m for tid, m in refund.counts.items() if tid in first_new}
            fresh = {tid: m for tid, m in refund.counts.items() if tid not in first_new}
            seed = derive(cfg.seed, step, 1 + len(plans) + j)
            if fresh:
                collector.bare_rollouts(fresh, seed=seed)
            if started:
                collector.continuations({(tid, 0): m for tid, m in started.items()}, seed=derive(seed, 1))
            trees = collector.trees
            mixed = sum(len({float(leaf.reward) for c in trees[tid].root.children if c >= first_new.get(tid, 0)
                             for leaf in trees[tid].leaves(c)}) > 1 for tid in refund.counts)
            row.update(rollouts=sum(refund.counts.values()), prompts=len(refund.counts), expected_mixed=refund.gain,
                       mixed=mixed, cost=refund.cost)
        refunded.append(row)
    for setting in settings:
        fit_predictor(setting.predictor, list(collector.trees.values()), target=cfg.predictor.target)
    return [{**r, "step": step} for r in records], refunded


def flip_job(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from trace_gym.training.driver.builders import make_predictor
    from trace_gym.training.driver.trainer import Trainer
    from trace_gym.training.variants import FlipScale

    torch.set_num_threads(job["threads"])
    task = TASKS[job["task"]]
    run_dir = BENCH_RUNS / task["name"] / "flips" / f"seed-{job['seed']}"
    kwargs = {"n_tasks": job["tasks"], "task_seed": 0, **task["env_kwargs"], "tiers": task["tiers"]}
    overrides = [
        f"model.path={job['model']}", "sft.enabled=false", f"seed={job['seed']}", f"env.kwargs={json.dumps(kwargs)}",
        f"alloc.roots={job['roots']}", f"alloc.multiplier={job['multiplier']}", f"alloc.pool_size={job['pool']}",
        "eval.tasks=0", "env.workers=1", "log.save_trees=none", *task["overrides"],
        *(CALIBRATED if job["calibrated"] else [])]
    trainer = Trainer(train_config(task["env"], run_dir, overrides))
    settings = []
    for name in job["predictors"]:
        extra = PREDICTORS[name]["overrides"]
        predictor = trainer.predictor if not extra else make_predictor(
            train_config(task["env"], run_dir, [*overrides, *extra]), _no_hidden_states, trainer.stream.tasks)
        settings.append(Setting(name, predictor, PREDICTORS[name]["flip_scale"],
                                {plan: FlipScale(FLIP_SCALE_PRIOR) for plan in ("trace", "trace_root", "trace_plus")}))
    try:
        steps = [flip_step(trainer, s + 1, settings) for s in range(job["steps"])]
    finally:
        trainer.close()
    return {"records": [r for rows, _ in steps for r in rows], "refunds": [r for _, rows in steps for r in rows]}


def _no_hidden_states() -> Any:
    raise RuntimeError("expected a text-feature predictor setting, got one that reads hidden states")


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
                     "expected_scaled": float(np.nansum([r.get("scaled", np.nan) for r in v])),
                     "anchor_share": flip_share(v), "continuation_share": continuation_flip_share(v)}
            for k, v in sorted(by.items())}


def realised_over_predicted(rows: list[dict[str, Any]], key: str = "expected") -> float:
    """Flipped anchors over the flips ``key`` predicted (NaN where nothing was predicted)."""
    predicted = float(np.nansum([r.get(key, np.nan) for r in rows]))
    return sum(r["flipped"] for r in rows) / predicted if predicted > 0 else float("nan")


def summarise(records: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """Per plan: shares over seeds (mean ± 95% t), realised over predicted flips (the predictor's own and the flip
    scale's, pooled and per seed), and pooled rows by depth, tier and step."""
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
                     "expected_scaled": float(np.nansum([r.get("scaled", np.nan) for r in rows])),
                     "ratio": realised_over_predicted(rows), "ratio_scaled": realised_over_predicted(rows, "scaled"),
                     "ratio_per_seed": mean_ci([realised_over_predicted(rs) for rs in per_seed]),
                     "ratio_scaled_per_seed": mean_ci([realised_over_predicted(rs, "scaled") for rs in per_seed]),
                     "ratio_scaled_after_step_1": realised_over_predicted([r for r in rows if r["step"] > 1],
                                                                          "scaled"),
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
              f"({g['continuations']} continuations) flipped, predictor expected {g['expected']:.0f} "
              f"(realised/predicted {g['ratio']:.2f}; with the flip scale {g['expected_scaled']:.0f}, "
              f"{g['ratio_scaled']:.2f}); "
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
    parser.add_argument("--predictors", nargs="+", default=["default"], choices=sorted(PREDICTORS),
                        help="predictor settings run side by side on the same bare rollouts (PREDICTORS)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from concurrent.futures import ProcessPoolExecutor

    seeds = args.seeds or (1 if args.quick else 2)
    steps = args.steps or (2 if args.quick else 6)
    roots = 32 if args.quick else args.roots
    names = args.task_names or (["chain"] if args.quick else sorted(TASKS))
    start = time.perf_counter()
    predictors = list(dict.fromkeys(args.predictors))
    result: dict[str, Any] = {"settings": {"seeds": seeds, "steps": steps, "roots": roots, "multiplier": 1,
                                           "pool": 64, "tasks": 256, "calibrated": args.calibrated,
                                           "predictors": {p: PREDICTORS[p] for p in predictors},
                                           "flip_scale_prior": FLIP_SCALE_PRIOR}}
    for name in names:
        model = warm_model(TASKS[name]["env"], TASKS[name]["name"] + ("-quick" if args.quick else ""),
                           [*TASKS[name]["warm_overrides"], *(QUICK_WARM if args.quick else [])])
        jobs = [{"task": name, "seed": s, "steps": steps, "roots": roots, "multiplier": 1, "pool": 64, "tasks": 256,
                 "model": model, "threads": max(1, 2 // args.workers), "calibrated": args.calibrated,
                 "predictors": predictors} for s in range(seeds)]
        with ProcessPoolExecutor(args.workers) as ex:
            done = list(ex.map(flip_job, jobs))
        records = [{**r, "seed": job["seed"]} for job, out in zip(jobs, done) for r in out["records"]]
        refunds = [r for out in done for r in out["refunds"]]
        result[name] = {}
        for p in predictors:  # one table per predictor setting
            result[name][p] = summarise([r for r in records if r["predictor"] == p], seeds)
            result[name][p]["refund"] = {k: float(np.sum([r[k] for r in refunds if r["predictor"] == p]))
                                         for k in ("rollouts", "prompts", "expected_mixed", "mixed", "cost")}
            print_summary(f"{name}, predictor {p}", result[name][p])
    payload = {"machine": machine(), "seconds": time.perf_counter() - start, "flips": result}
    path = write_json(("flips_quick" if args.quick else "flips") + ("_calibrated" if args.calibrated else "")
                      + ("_resolution" if "resolution" in predictors else ""), payload)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
