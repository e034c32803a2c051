"""(a) of the allocation benchmark: TRACE against its baselines at equal trajectory budget on the simulation
env (exact values known), plus diagnostics that change one thing at a time (see allocation.py).

Every row runs the trainer's own step (`training.step.take_step`) over `simulation.SimCollector`.

`resolution_run` compares stage 2 alone with the oracle's (benchmarks/predictor_resolution.py): on the same bare
rollouts, the flips a plan finds in expectation under the exact values, over those of the plan the exact values
choose, for the predictor settings of `RESOLUTION_SETTINGS` (log-prob features, the flip scale).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import mean_ci, pyplot

from trace_gym.seeds import derive, generator
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import StagedAllocator, make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix
from trace_gym.training.allocation.predictor_wrappers import ReplayPredictor
from trace_gym.training.allocation.solvers import prefix_utility
from trace_gym.training.allocation.stages import (
    ContinuationPlan,
    RootAllocation,
    ValueFn,
    allocate_roots,
    fit_predictor,
    flip_metrics,
    plan_continuations,
)
from trace_gym.training.config import ALLOCATORS, StepBudget
from trace_gym.training.simulation import TERRAIN, SimCollector, make_tasks, value_at
from trace_gym.training.step import take_step
from trace_gym.training.variants import FlipScale, VariantAllocator
from trace_gym.tree import RolloutTree

METRICS = {  # output name -> take_step metric key (None: derived)
    "effective_ratio": "alloc/effective_ratio",
    "effective_ratio_sample": "alloc/effective_ratio_sample",
    "mixed_prompts": None,
    "prompts": "rollout/prompts",
    "pairs_per_trajectory": "alloc/pairs_per_trajectory",
    "pairs_per_1k_tokens": "alloc/pairs_per_1k_tokens",
    "tokens": "rollout/tokens",
    "trajectories": "rollout/trajectories",
    "success": "rollout/success",
    "brier_true": "predictor/brier_true",
}


@dataclass(frozen=True)
class ExploringAllocator(StagedAllocator):
    """Active roots that give a fraction ``explore`` of the root budget to uniformly drawn unchosen prompts
    (2 rollouts each), so the predictor keeps seeing prompts it believes are settled."""

    explore: float = 0.0

    def allocate_roots(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> dict[int, int]:
        n_explore = min(round(self.explore * budget / 2), len(values) // 2)
        if self.roots != "active" or n_explore == 0:
            return super().allocate_roots(values, budget, rng)
        chosen = super().allocate_roots(values, budget - 2 * n_explore, rng)
        rest = np.array([i for i in range(len(values)) if i not in chosen])
        for i in rng.choice(rest, size=min(n_explore, len(rest)), replace=False):
            chosen[int(i)] = 2
        return chosen


class StagePredictor:
    """A learned predictor whose root and/or prefix outputs are replaced by the exact values (diagnostic)."""

    def __init__(self, inner: Any, tasks: Sequence[Task], exact_roots: bool, exact_prefixes: bool):
        self.inner, self.exact_roots, self.exact_prefixes = inner, exact_roots, exact_prefixes
        self.tasks = {t.id: t for t in tasks}

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        out = self.inner.predict(prefixes)
        for i, p in enumerate(prefixes):
            if (p.depth == 0 and self.exact_roots) or (p.depth > 0 and self.exact_prefixes):
                out[i] = value_at(self.tasks[p.task_id], p.depth, sum("safe path" in a for a, _ in p.turns))
        return out

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        return self.inner.fit(prefixes, targets, weights)


_PROMPT = re.compile(r"Reach (\d+) checkpoints in at most (\d+) moves across (\w+) terrain")


class HintPredictor:
    """The best a predictor that reads only the text can do without memorising tasks (diagnostic).

    The posterior mean of the exact value given the prompt's need and terrain word and the prefix's good/bad
    moves, under the simulation's task generator (p_good ~ Beta(0.7, 0.7), hint right 70% of the time).
    """

    def __init__(self, hint_accuracy: float = 0.7, grid: int = 2001):
        self.p = np.linspace(0.0005, 0.9995, grid)
        prior = self.p ** (0.7 - 1) * (1 - self.p) ** (0.7 - 1)
        tier = np.minimum((self.p * len(TERRAIN)).astype(int), len(TERRAIN) - 1)
        self.post = {w: prior * (hint_accuracy * (tier == k) + (1 - hint_accuracy) / len(TERRAIN))
                     for k, w in enumerate(TERRAIN)}

    def _value(self, need: int, horizon: int, word: str, moves: int, good: int) -> float:
        still, left = need - good, horizon - moves
        if still <= 0:
            return 1.0
        if still > left:
            return 0.0
        w = self.post[word] * self.p**good * (1 - self.p) ** (moves - good)
        v = sum(math.comb(left, j) * self.p**j * (1 - self.p) ** (left - j) for j in range(still, left + 1))
        return float(np.sum(w * v) / np.sum(w))

    def predict(self, prefixes: Sequence[Prefix]) -> np.ndarray:
        out = np.full(len(prefixes), 0.5)
        for i, p in enumerate(prefixes):
            m = _PROMPT.search(p.prompt)
            if m and m.group(3) in self.post:
                good = sum("safe path" in a for a, _ in p.turns)
                out[i] = self._value(int(m.group(1)), int(m.group(2)), m.group(3), p.depth, good)
        return out

    def fit(self, prefixes: Sequence[Prefix], targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        return {"predictor/examples": float(len(prefixes))}


PREDICTOR_DEFAULTS = {name: p.default for name, p in inspect.signature(FeaturePredictor).parameters.items()}


@dataclass(frozen=True)
class Variant:
    """One row: an allocator plus what the diagnostics change."""

    label: str
    allocator: str
    predictor: str = "learned"  # learned | hint | exact_roots | exact_prefixes
    explore: float = 0.0
    free_uniform_fit: bool = False  # also fit the predictor on a flat grpo batch each step, outside the budget
    group_size: int = 8  # uniform/pcl roots: rollouts per prompt
    lr: float = PREDICTOR_DEFAULTS["lr"]  # FeaturePredictor learning rate
    fit_steps: int = PREDICTOR_DEFAULTS["steps"]  # FeaturePredictor Adam steps per fit
    replay: int = 0  # fit the learned predictor on the last ``replay`` steps' examples (0: this step's only)


def variants(quick: bool) -> tuple[list[Variant], list[Variant]]:
    """(the allocators at the default shape, the diagnostics)."""
    main = [Variant(name, name) for name in ALLOCATORS]
    diag = [
        Variant("trace: exact root values", "trace", predictor="exact_roots"),
        Variant("trace: exact prefix values", "trace", predictor="exact_prefixes"),
        Variant("trace: text-posterior predictor", "trace", predictor="hint"),
        Variant("trace: + free uniform fit", "trace", free_uniform_fit=True),
        Variant("trace: explore 25%", "trace", explore=0.25),
        Variant("trace: replay last 8 steps", "trace", replay=8),
        # A defect found early on: lr 0.05 lets each fit overwrite the shared features (predictor.py, 3).
        Variant("trace: predictor lr 0.05 (old default)", "trace", lr=0.05),
        Variant("grpo: predictor lr 0.05 (old default)", "grpo", lr=0.05),
    ]
    if not quick:
        diag += [Variant("trace: explore 50%", "trace", explore=0.5),
                 Variant("trace: lr 0.05, 10 Adam steps", "trace", lr=0.05, fit_steps=10)]
        diag += [Variant(f"{n} (root groups of 2)", n, group_size=2)
                 for n in ("uniform_uniform", "uniform_active")]  # active roots ignore group_size
    return main, diag


def _allocator(v: Variant) -> StagedAllocator:
    base = make_allocator(v.allocator, group_size=v.group_size)
    if v.explore:
        return ExploringAllocator(base.name, base.roots, base.prefixes, base.oracle, base.group_size, base.cap,
                                  explore=v.explore)
    return base


def _predictor(v: Variant, tasks: Sequence[Task]) -> Any:
    if v.predictor == "hint":
        return HintPredictor()
    if v.predictor in ("exact_roots", "exact_prefixes"):
        return StagePredictor(FeaturePredictor(lr=v.lr, steps=v.fit_steps), tasks, v.predictor == "exact_roots",
                              v.predictor == "exact_prefixes")
    learned = FeaturePredictor(lr=v.lr, steps=v.fit_steps)
    return ReplayPredictor(learned, v.replay) if v.replay else learned



def run_variant(v: Variant, seed: int, cfg: dict[str, int]) -> list[dict[str, float]]:
    """One seed of one variant: per-step metrics of the shared step (`take_step`) on the simulation."""
    tasks = make_tasks(cfg["tasks"], horizon=cfg["horizon"], seed=seed)
    allocator, predictor = _allocator(v), _predictor(v, tasks)
    budget = StepBudget(cfg["roots"], cfg["multiplier"])
    collector, grpo = SimCollector(tasks), make_allocator("grpo")
    rng = np.random.default_rng(10_000 + seed)
    rows = []
    for step in range(1, cfg["steps"] + 1):
        pool = [tasks[i] for i in rng.choice(len(tasks), size=cfg["pool"], replace=False)]
        rows.append(metric_row(take_step(collector, allocator, predictor, pool, budget, seed=10_000 + seed,
                                         step=step).metrics))
        if v.free_uniform_fit:  # fits the predictor on uniform prompts, outside the budget
            take_step(collector, grpo, predictor, pool, budget, seed=20_000 + seed, step=step)
    return rows


def metric_row(m: dict[str, Any]) -> dict[str, float]:
    """A step's metrics under the benchmark's names (METRICS)."""
    row = {k: float(m.get(key, float("nan"))) for k, key in METRICS.items() if key}
    row["mixed_prompts"] = row["effective_ratio"] * row["prompts"]
    return row


def finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none (brier_true on real envs), without numpy's warning."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def summarise(runs: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Per metric: mean ± 95% CI over seeds of each seed's mean over the second half of its steps."""
    out: dict[str, Any] = {}
    for k in METRICS:
        per_seed = [finite_mean([r[k] for r in rows[len(rows) // 2:]]) for rows in runs]
        out[k] = mean_ci(per_seed)
    out["curve"] = [float(np.mean([rows[s]["effective_ratio"] for rows in runs])) for s in range(len(runs[0]))]
    return out


def _job(args: tuple[Variant, int, dict[str, int]]) -> tuple[str, int, list[dict[str, float]]]:
    v, seed, cfg = args
    return v.label, seed, run_variant(v, seed, cfg)


def simulate(quick: bool, seeds: int, steps: int, workers: int, tasks: int = 512, pool: int = 128,
             roots: int = 32, multiplier: int = 3, horizon: int = 4, diagnostics: bool = True) -> dict[str, Any]:
    """Every variant × seed; returns the summary (main allocators and diagnostics) with the settings."""
    cfg = {"tasks": tasks, "pool": pool, "roots": roots, "multiplier": multiplier, "horizon": horizon,
           "steps": steps}
    main, diag = variants(quick)
    todo = main + (diag if diagnostics else [])
    jobs = [(v, s, cfg) for v in todo for s in range(seeds)]
    results: dict[str, list[list[dict[str, float]]]] = {v.label: [] for v in todo}
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            done = list(ex.map(_job, jobs, chunksize=1))
    else:
        done = [_job(j) for j in jobs]
    for label, _, rows in sorted(done, key=lambda d: d[1]):
        results[label].append(rows)
    summary = {v.label: {"variant": v.__dict__, **summarise(results[v.label])} for v in todo}
    return {"settings": {**cfg, "seeds": seeds, "budget_per_step": roots * (1 + multiplier)},
            "allocators": {v.label: summary[v.label] for v in main},
            "diagnostics": {v.label: summary[v.label] for v in todo if v not in main}}


# ------------------------------------------------------------------ stage 2 against the oracle's
RESOLUTION_SETTINGS = {"default": (False, False), "scale": (False, True), "logprobs": (True, False),
                       "resolution": (True, True)}
"""Predictor settings: name -> (log-prob features, flip scale). The scale acts on trace_root only (trace compares
no prefix with a root); it is measured on both."""
RESOLUTION_PLANS = ("trace", "trace_root")


def expected_flips(plan: ContinuationPlan, trees: Mapping[str, RolloutTree], exact: ValueFn) -> float:
    """Σ 1 - q^k over ``plan``'s anchors with q from the exact values: the flips it finds in expectation."""
    chosen = [c for c in plan.prefixes if c.continuations]
    if not chosen:
        return 0.0
    v = exact([Prefix.from_tree(trees[c.task_id], c.node_id) for c in chosen])
    return float(sum(prefix_utility(c.reward, vi, c.continuations) for c, vi in zip(chosen, v)))


def stage2_plan(name: str, values: ValueFn, trees: Mapping[str, RolloutTree], roots: RootAllocation,
                budget: StepBudget, rng: np.random.Generator, scale: FlipScale | None = None) -> ContinuationPlan:
    """Stage 2 of allocator ``name`` (trace or a TRACE variant, given ``scale`` when it allocates with one)."""
    allocator = make_allocator(name)
    if isinstance(allocator, VariantAllocator):
        return dataclasses.replace(allocator, flip_scale=scale).plan(values, trees, roots, budget, rng)[0]
    return plan_continuations(allocator, values, trees, roots, budget, rng)


def resolution_run(seed: int, cfg: dict[str, int]) -> list[dict[str, float]]:
    """One seed: per step, trace's roots (valued by the default predictor), bare rollouts that record each move's
    log-probability, then every plan of ``RESOLUTION_PLANS`` from the exact values and from each setting. Per
    (setting, plan): its expected flips and the oracle plan's, the flips its continuations realised and the
    predictor's and the scale's expectations of them. Both predictors fit on every tree of the step."""
    tasks = make_tasks(cfg["tasks"], horizon=cfg["horizon"], seed=seed)
    collector = SimCollector(tasks, logprobs=True)
    predictors = {False: FeaturePredictor(), True: FeaturePredictor(logprob_features=True)}
    scales = {(name, plan): FlipScale() for name in RESOLUTION_SETTINGS for plan in RESOLUTION_PLANS}
    budget = StepBudget(cfg["roots"], cfg["multiplier"])
    draw = np.random.default_rng(10_000 + seed)
    rows = []
    for step in range(1, cfg["steps"] + 1):
        pool = [tasks[i] for i in draw.choice(len(tasks), size=cfg["pool"], replace=False)]
        rng = generator(10_000 + seed, step)
        roots = allocate_roots(make_allocator("trace"), predictors[False].predict, pool, budget, rng)
        collector.begin_step()
        collector.bare_rollouts(roots.counts, seed=derive(10_000 + seed, step, 0))
        bare, exact = collector.trees, collector.true_values
        row: dict[str, float] = {"step": float(step)}
        for plan_name in RESOLUTION_PLANS:
            row[f"oracle/{plan_name}"] = expected_flips(stage2_plan(plan_name, exact, bare, roots, budget, rng),
                                                        bare, exact)
        # Every plan is made on the bare trees before any continuation runs (they grow the shared trees).
        plans = {(name, plan_name): stage2_plan(plan_name, predictors[logprobs].predict, bare, roots, budget, rng,
                                                scales[name, plan_name] if scaled else None)
                 for name, (logprobs, scaled) in RESOLUTION_SETTINGS.items() for plan_name in RESOLUTION_PLANS}
        for i, ((name, plan_name), plan) in enumerate(plans.items()):
            scale, key = scales[name, plan_name], f"{name}/{plan_name}"
            row[f"{key}/expected_true"] = expected_flips(plan, bare, exact)
            first_new = {tid: len(tree) for tid, tree in collector.trees.items()}
            collector.continuations(plan.counts(), seed=derive(10_000 + seed, step, 1 + i))
            m = flip_metrics(collector.trees, plan, first_new)
            deep = [c for c in plan.prefixes if c.node_id != 0 and c.continuations and c.utility is not None]
            row[f"{key}/realised"] = m["alloc/prefix_flips"]
            row[f"{key}/predicted"] = m["alloc/prefix_flips_expected"]
            row[f"{key}/scaled"] = float(sum((c.utility or 0.0) * scale([c.node_id], np.array([c.reward]))[0]
                                             for c in deep))
            scale.expect(plan, first_new)  # scored on this plan's continuations alone, before the next plan's
            scale.observe(collector.trees)
        for predictor in predictors.values():
            fit_predictor(predictor, list(collector.trees.values()))
        rows.append(row)
    return rows


def summarise_resolution(runs: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Per setting and plan, over the second half of each seed's steps: the share of the oracle's expected flips
    (each seed's sums, then mean ± 95% t over seeds) and realised over predicted flips (pooled over seeds)."""
    half = [rows[len(rows) // 2:] for rows in runs]

    def total(key: str, rows: list[dict[str, float]]) -> float:
        return float(sum(r[key] for r in rows))

    out: dict[str, Any] = {}
    for name in RESOLUTION_SETTINGS:
        for plan in RESOLUTION_PLANS:
            key = f"{name}/{plan}"
            realised = sum(total(f"{key}/realised", rows) for rows in half)
            out[key] = {
                "fraction_of_oracle": mean_ci([total(f"{key}/expected_true", rows) / total(f"oracle/{plan}", rows)
                                               for rows in half]),
                "realised": realised, "predicted": sum(total(f"{key}/predicted", rows) for rows in half),
                "scaled": sum(total(f"{key}/scaled", rows) for rows in half),
                "realised_over_predicted": realised / sum(total(f"{key}/predicted", rows) for rows in half),
                "realised_over_scaled": realised / sum(total(f"{key}/scaled", rows) for rows in half)}
    return out


def plot_sim(sim: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    rows = {**sim["allocators"], **sim["diagnostics"]}
    labels = list(rows)
    y = np.arange(len(labels))
    for k, (key, color) in enumerate((("effective_ratio", "tab:blue"), ("effective_ratio_sample", "tab:orange"))):
        means = [rows[lab][key]["mean"] for lab in labels]
        errs = [np.nan_to_num(rows[lab][key]["ci95"]) for lab in labels]
        ax1.barh(y + (k - 0.5) * 0.4, means, 0.4, xerr=errs, color=color, label=key.replace("_", " "))
    ax1.set_yticks(y, labels, fontsize=7)
    ax1.invert_yaxis()
    ax1.set_xlim(0, 1)
    ax1.set_xlabel("effective ratio (mean, 95% CI over seeds)")
    ax1.legend(fontsize=7, loc="lower right")
    s = sim["settings"]
    ax1.set_title(f"simulation, {s['budget_per_step']} trajectories/step, {s['seeds']} seeds", fontsize=9)
    for lab in ("grpo", "treepo", "trace", "oracle", "trace: + free uniform fit",
                "trace: predictor lr 0.05 (old default)", "trace: text-posterior predictor"):
        if lab in rows:
            ax2.plot(rows[lab]["curve"], label=lab)
    ax2.set_xlabel("step")
    ax2.set_ylabel("effective ratio (mean over seeds)")
    ax2.set_ylim(0, 1.02)
    ax2.legend(fontsize=7)
    ax2.set_title("warm-up of the learned predictor", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


