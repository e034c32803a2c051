"""Which predictor ranks real prompts? Offline replay of predictor_data.py's rollouts (fixed policy).

The prompts of the task set are drawn in a seeded shuffled order per epoch, ``--pool`` per step, so each
prompt comes back once per epoch (visit v of a prompt uses that visit's recorded group of rollouts). Each
step, every predictor values the pool's prompts before their outcomes are seen; an allocator chooses from
those values (trace: the exact root solver, M = 32 roots, cap 8; pcl: the 8 prompts nearest 0.5; grpo: 8 at
random; trace_adaptive: training/allocation/allocators.py, its trust measured on these outcomes); the predictor is then
fit on what that allocator chose (trace: each chosen prompt's first m_i
rollouts as a tree, prefixes included; grpo/pcl: all 8). Scores per step, against the group's mean success
(8 rollouts): Brier and Spearman over the whole pool and among the chosen prompts, and the per-prompt
effective ratio the choice reaches (unbiased from the 8 outcomes: a prompt with m roots and m·N
continuations counts as m·(1+N) rollouts, N = 1; grpo/pcl: the group of 8 itself). Reported per epoch:
epoch 1 has no revisits, later epochs do.

    .venv/bin/python benchmarks/studies/predictor_study.py --case level2
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _study import STUDY_RUNS

from trace_gym.training.allocation.allocators import AdaptiveAllocator, mixed_share
from trace_gym.training.allocation.metrics import brier, rank_correlation
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix, training_examples
from trace_gym.training.allocation.predictor_wrappers import PromptPosterior, ReplayPredictor
from trace_gym.training.allocation.solvers import solve_roots
from trace_gym.training.config import StepBudget
from trace_gym.tree import RolloutTree


def load(case: str) -> tuple[dict[str, list[RolloutTree]], dict[str, dict[str, Any]]]:
    folder = STUDY_RUNS / "predictor" / case
    visits: dict[str, list[RolloutTree]] = {}
    with open(folder / "visits.jsonl") as f:
        for line in f:
            d = json.loads(line)
            visits.setdefault(d["task_id"], []).append(RolloutTree.from_dict(d))
    return visits, json.loads((folder / "features.json").read_text())


def first_branches(tree: RolloutTree, m: int) -> RolloutTree:
    """A copy of ``tree`` holding only its first ``m`` root branches (what m bare rollouts would have given)."""
    out = RolloutTree(tree.task_id, tree.root.observation)
    ids = {0: 0}
    keep = set(tree.root.children[:m])
    for node in tree.nodes[1:]:
        top = node
        while top.parent not in (0, None):
            top = tree.nodes[top.parent]
        if top.id in keep:
            new = out.add(ids[node.parent], node.action or "", node.observation, node.reward, node.terminated,
                          node.truncated, node.info)
            ids[node.id] = new.id
    return out


class PolicyFeatures(FeaturePredictor):
    """The feature predictor plus the policy's greedy first turn: its summed and minimum token log-probability
    (looked up per task; computed once by predictor_data.py) as dense root features."""

    def __init__(self, table: dict[str, dict[str, Any]], **kw: Any):
        super().__init__(**kw)
        self.table = table

    def features(self, prefix: Prefix) -> tuple[np.ndarray, np.ndarray]:
        cols, vals = super().features(prefix)
        f = self.table.get(prefix.task_id)
        if f is None or prefix.depth:
            return cols, vals
        extra_c = np.array([self._hash("g:sum"), self._hash("g:min")])
        extra_v = np.array([f["greedy_sum"] / 5.0, f["greedy_min"] / 5.0])
        return np.concatenate([cols, extra_c]), np.concatenate([vals, extra_v])


def hidden(model_path: str) -> Callable[[], Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_gym.training.allocation.predictor import HiddenStatePredictor
    from trace_gym.training.driver.builders import hidden_state_fn

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    fn = hidden_state_fn(model, tok)
    cache: dict[Prefix, Any] = {}

    def cached(prefixes: Sequence[Prefix]) -> Any:
        todo = [p for p in prefixes if p not in cache]
        if todo:
            with torch.no_grad():
                for p, h in zip(todo, fn(todo)):
                    cache[p] = h
        return torch.stack([cache[p] for p in prefixes])

    return lambda: HiddenStatePredictor(cached, model.config.hidden_size)


def run(visits: dict[str, list[RolloutTree]], make: Callable[[], Any], allocator: str, pool: int, seed: int,
        roots: int = 32, cap: int = 8, n_cont: int = 1) -> list[dict[str, float]]:
    ids = sorted(visits)
    prompts = {tid: visits[tid][0].root.observation for tid in ids}
    epochs = min(len(v) for v in visits.values())
    steps = epochs * len(ids) // pool
    predictor, rng, seen = make(), np.random.default_rng(seed), {tid: 0 for tid in ids}
    adaptive = AdaptiveAllocator(group_size=8, cap=cap)
    rows = []
    for step in range(steps):
        epoch, start = divmod(step * pool, len(ids))
        order = np.random.default_rng([seed, epoch]).permutation(len(ids))
        chosen_ids = [ids[i] for i in order[start:start + pool]]
        trees = [visits[tid][seen[tid]] for tid in chosen_ids]
        for tid in chosen_ids:
            seen[tid] += 1
        v = np.clip(predictor.predict([Prefix(tid, prompts[tid]) for tid in chosen_ids]), 0, 1)
        k = np.array([sum(n.reward > 0 for n in t.leaves()) for t in trees])
        n = np.array([len(t.leaves()) for t in trees])
        target = k / n
        if allocator == "trace":
            m = solve_roots(v, roots, cap)
            draws = np.minimum(m * (1 + n_cont), n)
        elif allocator == "trace_adaptive":
            chosen = adaptive.allocate_roots(v, adaptive.root_budget(StepBudget(roots, n_cont)), rng)
            m = np.array([chosen.get(i, 0) for i in range(len(v))], dtype=np.int64)
            draws = np.minimum(m * (1 + n_cont), n)
        else:
            g = roots * (1 + n_cont) // 8
            if allocator == "grpo":
                pick = rng.choice(len(v), g, replace=False)
            else:  # pcl: nearest 0.5, ties in random order
                perm = rng.permutation(len(v))
                pick = perm[np.argsort(np.abs(v[perm] - 0.5), kind="stable")[:g]]
            m = np.zeros(len(v), dtype=np.int64)
            m[pick] = 8
            draws = np.minimum(m, n)
        sel = m > 0
        ratio = mixed_share(k[sel], n[sel], draws[sel])
        rows.append({"epoch": epoch + 1, "brier_pool": brier(v, target), "rank_pool": rank_correlation(v, target),
                     "brier_chosen": brier(v[sel], target[sel]), "rank_chosen": rank_correlation(v[sel], target[sel]),
                     "ratio": float(ratio.mean()), "mixed": float(ratio.sum()), "trust": adaptive.trust})
        fit_trees = [first_branches(t, int(mi)) for t, mi in zip(trees, m) if mi > 0]
        if allocator == "trace_adaptive":
            adaptive.observe({i: first_branches(t, int(mi)) for i, (t, mi) in enumerate(zip(trees, m)) if mi > 0})
        predictor.fit(*training_examples(fit_trees))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", required=True)
    p.add_argument("--pool", type=int, default=64)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--predictors", nargs="*", default=None)
    p.add_argument("--allocators", nargs="*", default=["grpo", "pcl", "trace", "trace_adaptive"])
    p.add_argument("--model", default=None, help="model folder for the hidden-state predictor")
    p.add_argument("--out", type=Path, default=Path("benchmarks/studies/logs/predictor_study.jsonl"))
    args = p.parse_args()
    visits, table = load(args.case)
    makers: dict[str, Callable[[], Any]] = {
        "features": lambda: FeaturePredictor(),
        "features+replay8": lambda: ReplayPredictor(FeaturePredictor(), 8),
        "policy": lambda: PolicyFeatures(table),
        "policy+replay8": lambda: ReplayPredictor(PolicyFeatures(table), 8),
        "posterior(features)": lambda: PromptPosterior(FeaturePredictor()),
        "posterior(features+replay8)": lambda: PromptPosterior(ReplayPredictor(FeaturePredictor(), 8)),
        "posterior(policy+replay8)": lambda: PromptPosterior(ReplayPredictor(PolicyFeatures(table), 8)),
    }
    if args.model:
        h = hidden(args.model)
        makers["hidden"] = h
        makers["hidden+replay8"] = lambda: ReplayPredictor(h(), 8)
        makers["posterior(hidden+replay8)"] = lambda: PromptPosterior(ReplayPredictor(h(), 8))
    names = args.predictors or list(makers)
    keys = ("brier_pool", "rank_pool", "brier_chosen", "rank_chosen", "ratio", "mixed", "trust")
    print(f"{args.case}: {len(visits)} prompts x {min(len(v) for v in visits.values())} visits")
    for alloc in args.allocators:
        for name in names:
            per_seed = [run(visits, makers[name], alloc, args.pool, s) for s in range(args.seeds)]
            out = {"case": args.case, "allocator": alloc, "predictor": name, "seeds": args.seeds}
            for ep in sorted({r["epoch"] for r in per_seed[0]}):
                for key in keys:
                    vals = [np.nanmean([r[key] for r in rows if r["epoch"] == ep]) for rows in per_seed]
                    out[f"e{ep}_{key}"] = [float(np.mean(vals)), float(1.96 * np.std(vals, ddof=1) /
                                                                      math.sqrt(len(vals)))]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(out) + "\n")
            last = max(r["epoch"] for r in per_seed[0])
            print(f"{alloc:5s} {name:30s} " + "  ".join(
                f"e{ep}: rank {out[f'e{ep}_rank_pool'][0]:+.2f}/{out[f'e{ep}_rank_chosen'][0]:+.2f} "
                f"brier {out[f'e{ep}_brier_pool'][0]:.3f} ratio {out[f'e{ep}_ratio'][0]:.3f}"
                for ep in (1, last)), flush=True)


if __name__ == "__main__":
    main()
