"""(a) of the allocation benchmark: TRACE against its baselines at equal trajectory budget on the simulation
env (exact values known), plus diagnostics that change one thing at a time (see allocation.py).

Every row runs the trainer's own step (`training.step.take_step`) over `simulation.SimCollector`.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import mean_ci, pyplot

from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import StagedAllocator, make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix
from trace_gym.training.allocation.predictor_wrappers import ReplayPredictor
from trace_gym.training.config import ALLOCATORS, StepBudget
from trace_gym.training.simulation import TERRAIN, SimCollector, make_tasks, value_at
from trace_gym.training.step import take_step

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


