"""The stages of a TRACE step as pure functions: inputs in, a typed record out (docs/design.md, "One step").

`allocate_roots` -> `RootAllocation` (stage 1: m_i bare rollouts per candidate prompt), `plan_continuations`
-> `ContinuationPlan` (stage 2: k continuations per open prefix), `fit_predictor` (calibration, then one fit;
returns metrics). None of them writes into the trees; `training.step` runs them in order and turns their
records into the viewer's node annotations.

A stage reads success estimates through a `ValueFn` (prefixes -> probabilities): the predictor's `predict`,
or the environment's exact values for the oracle allocator (`simulation.SimCollector.true_values`).

Choices where the paper is silent:
1. Open prefixes are the non-terminal nodes of depth >= 1 after the bare rollouts; each lies on exactly one
   bare rollout, whose reward is its r. A prompt with none sends its continuation budget to the root. Stage 2's
   anchors are the open prefixes (`open_anchors`); a caller may pass others (`Anchors`: the variants of
   training/variants.py add a prompt's root).
2. The predictor is scored on the fresh trees before it is fit on them, so its metrics are out-of-sample.
3. A flip (`flip_metrics`) is an anchor of which at least one continuation ended with the other outcome
   than its r; expected flips are Σ 1 - q^k with the values stage 2 saw. Reported per step for depth >= 1
   anchors (``alloc/prefix_*``) and for anchors at a root (``alloc/root_anchor_*``, the variants' only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import Allocator, expand_counts
from trace_gym.training.allocation.metrics import brier, calibration_metrics, rank_correlation
from trace_gym.training.allocation.predictor import Predictor, Prefix, training_examples
from trace_gym.training.allocation.solvers import prefix_utility, root_utility, solve_prefixes
from trace_gym.training.config import StepBudget
from trace_gym.tree import RolloutTree
from trace_gym.tree_stats import tree_values

ValueFn = Callable[[Sequence[Prefix]], np.ndarray]
"""Success probabilities in [0, 1], one per prefix (a predictor's `predict`, or exact values)."""

Anchors = Callable[[RolloutTree], tuple[list[int], np.ndarray]]
"""Where stage 2 may continue in a tree after its bare rollouts: node ids, and the reward r in [0, 1] of the bare
rollout each lies on (choice 1)."""

GainScale = Callable[[Sequence[int], np.ndarray], np.ndarray]
"""What one predicted flip is worth at each anchor, from its node ids and rewards r (stage 2 then maximises
Σ s·(1 - q^k): `solvers.solve_prefixes`'s ``scale``; training/variants.py, `FlipScale`)."""


# --------------------------------------------------------------------------------------------- stage 1
@dataclass(frozen=True)
class RootAllocation:
    """Stage 1's decision: ``counts[task id] = m_i > 0`` bare rollouts over the candidate pool ``task_ids``.
    ``values`` holds the pool's success estimates when the allocator used them (None when it chose without)."""

    task_ids: tuple[str, ...]
    values: np.ndarray | None
    counts: dict[str, int]

    def value(self, task_id: str) -> float | None:
        """The estimate stage 1 saw for ``task_id`` (None without estimates or outside the pool)."""
        if self.values is None or task_id not in self.task_ids:
            return None
        return float(self.values[self.task_ids.index(task_id)])

    def utility(self, task_id: str) -> float | None:
        """U_root(v, m) = 1 - v^m - (1-v)^m of ``task_id``'s decision (None without an estimate)."""
        v = self.value(task_id)
        return None if v is None else float(root_utility(min(max(v, 0.0), 1.0), self.counts.get(task_id, 0)))

    def metrics(self) -> dict[str, float]:
        values = self.values if self.values is not None else np.full(len(self.task_ids), 0.5)
        picked = np.array([values[i] for i, tid in enumerate(self.task_ids) if tid in self.counts])
        return {"alloc/pool": float(len(self.task_ids)), "alloc/prompts": float(len(self.counts)),
                "alloc/roots": float(sum(self.counts.values())),
                "alloc/pool_value_mean": float(np.mean(values)) if len(values) else float("nan"),
                "alloc/chosen_value_mean": float(picked.mean()) if len(picked) else float("nan")}


def allocate_roots(allocator: Allocator, values: ValueFn, pool: Sequence[Task], budget: StepBudget,
                   rng: np.random.Generator) -> RootAllocation:
    """Stage 1 over the candidate ``pool``; ``values`` is called only when the allocator reads estimates."""
    estimates = values([Prefix(t.id, t.prompt) for t in pool]) if allocator.needs_root_values else None
    chosen = allocator.allocate_roots(estimates if estimates is not None else np.full(len(pool), 0.5),
                                      allocator.root_budget(budget), rng)
    counts = {pool[i].id: int(m) for i, m in sorted(chosen.items())}
    return RootAllocation(tuple(t.id for t in pool), estimates, counts)


# --------------------------------------------------------------------------------------------- stage 2
@dataclass(frozen=True)
class PrefixChoice:
    """Stage 2 at one open prefix: the reward ``reward`` of the bare rollout it lies on, the estimate ``value``
    (None when the allocator chose without), and the ``continuations`` k it receives (0 included)."""

    task_id: str
    node_id: int
    reward: float
    value: float | None
    continuations: int

    @property
    def utility(self) -> float | None:
        """U_pref = 1 - q^k with q = r·v + (1-r)(1-v) (None without an estimate)."""
        if self.value is None:
            return None
        return float(prefix_utility(self.reward, min(max(self.value, 0.0), 1.0), self.continuations))


@dataclass(frozen=True)
class ContinuationPlan:
    """Stage 2's decision: every open prefix of every prompt with a continuation budget, and the budget sent to
    a prompt's root when it had no open prefix (``root_extra``)."""

    prefixes: tuple[PrefixChoice, ...]
    root_extra: dict[str, int]

    def counts(self) -> dict[tuple[str, int], int]:
        """{(task id, node id): k > 0}, the collector's `continuations` argument (node 0: root extras)."""
        out = {(c.task_id, c.node_id): c.continuations for c in self.prefixes if c.continuations}
        for tid, k in self.root_extra.items():
            out[(tid, 0)] = out.get((tid, 0), 0) + k
        return out

    def metrics(self) -> dict[str, float]:
        counts = self.counts()
        return {"alloc/continuations": float(sum(counts.values())),
                "alloc/root_extra": float(sum(self.root_extra.values())), "alloc/branch_points": float(len(counts)),
                "alloc/root_anchor_continuations": float(sum(c.continuations for c in self.prefixes
                                                             if c.node_id == 0))}


def open_prefixes(tree: RolloutTree) -> list[int]:
    """Non-terminal nodes of depth >= 1 (after bare rollouts: each lies on one rollout), choice 1."""
    return [n.id for n in tree.nodes if n.depth >= 1 and not n.is_terminal]


def open_anchors(tree: RolloutTree) -> tuple[list[int], np.ndarray]:
    """The paper's anchors (choice 1): the open prefixes, each with its bare rollout's reward."""
    nodes = open_prefixes(tree)
    return nodes, np.clip(np.nan_to_num(tree_values(tree)[0][nodes]), 0.0, 1.0)


def plan_continuations(allocator: Allocator, values: ValueFn, trees: Mapping[str, RolloutTree],
                       roots: RootAllocation, budget: StepBudget, rng: np.random.Generator,
                       anchors: Anchors = open_anchors, scale: GainScale | None = None) -> ContinuationPlan:
    """Stage 2: each prompt's budget `prefix_budget(m_i)` over its ``anchors`` (choice 1); with ``scale``, an
    allocator that reads prefix values weighs each anchor's gain by it."""
    choices: list[PrefixChoice] = []
    root_extra: dict[str, int] = {}
    for tid, tree in trees.items():
        b = allocator.prefix_budget(roots.counts.get(tid, 0), budget)
        if b == 0:
            continue
        nodes, rewards = anchors(tree)
        predicted = bool(allocator.needs_prefix_values and nodes)
        estimates = values([Prefix.from_tree(tree, n) for n in nodes]) if predicted else np.full(len(nodes), 0.5)
        if scale is not None and predicted:
            counts, extra = solve_prefixes(rewards, np.clip(estimates, 0.0, 1.0), b, scale(nodes, rewards)), 0
        else:
            counts, extra = expand_counts(allocator, rewards, estimates, b, rng)
        choices.extend(PrefixChoice(tid, n, float(r), float(v) if predicted else None, int(k))
                       for n, r, v, k in zip(nodes, rewards, estimates, counts))
        if extra:
            root_extra[tid] = int(extra)
    return ContinuationPlan(tuple(choices), root_extra)


def continuation_outcomes(tree: RolloutTree, node_id: int, first_new: int) -> list[float]:
    """The rewards of the leaves below the children of ``node_id`` created from node ``first_new`` on (one stage-2
    plan's continuations from that anchor, choice 3)."""
    return [float(leaf.reward) for k in tree[node_id].children if k >= first_new for leaf in tree.leaves(k)]


def flip_metrics(trees: Mapping[str, RolloutTree], plan: ContinuationPlan, first_new: Mapping[str, int]
                 ) -> dict[str, float]:
    """Choice 3, after the continuations ran: ``first_new[task id]`` is the first node id they created (the tree's
    size before them), so an anchor's continuations are its children from there on."""
    out: dict[str, float] = {}
    for label, keep in (("prefix", lambda c: c.node_id != 0), ("root_anchor", lambda c: c.node_id == 0)):
        anchors = [c for c in plan.prefixes if c.continuations and keep(c)]
        flips, expected, continuations, flipped_continuations = 0, 0.0, 0, 0
        for c in anchors:
            outcomes = continuation_outcomes(trees[c.task_id], c.node_id, first_new.get(c.task_id, 0))
            other = sum(o != c.reward for o in outcomes)
            flips += other > 0
            flipped_continuations += other
            continuations += len(outcomes)
            expected += c.utility if c.utility is not None else float("nan")
        out.update({f"alloc/{label}_anchors": float(len(anchors)), f"alloc/{label}_flips": float(flips),
                    f"alloc/{label}_flips_expected": expected if anchors else 0.0,
                    f"alloc/{label}_flip_share": flips / len(anchors) if anchors else float("nan"),
                    f"alloc/{label}_continuation_flip_share":
                        flipped_continuations / continuations if continuations else float("nan")})
    return out


# --------------------------------------------------------------------------------------------- predictor
def fit_predictor(predictor: Predictor, trees: Sequence[RolloutTree], exact: ValueFn | None = None,
                  target: str = "leaves") -> dict[str, Any]:
    """The fresh trees' targets (``target``: `predictor.training_examples`); the current predictor's calibration
    on them (and against ``exact`` values when the environment knows them: ``predictor/brier_true``), on the
    roots and on the prefixes of depth >= 1 apart, then one fit (choice 2)."""
    prefixes, targets, weights = training_examples(trees, target)
    if not prefixes:
        return {"predictor/examples": 0.0}
    pred = predictor.predict(prefixes)
    out: dict[str, Any] = calibration_metrics(pred, targets, weights)
    if exact is not None:
        out["predictor/brier_true"] = brier(pred, exact(prefixes), weights)
    # Roots alone: does the predictor rank this step's prompts? (what stage 1 needs; deeper prefixes are easier)
    roots = np.array([p.depth == 0 for p in prefixes])
    out["predictor/root_brier"] = brier(pred[roots], targets[roots], weights[roots]) if roots.any() else float("nan")
    out["predictor/root_rank_corr"] = rank_correlation(pred[roots], targets[roots])
    # Prefixes alone: what stage 2 reads (its 1 - q^k)
    deep = ~roots
    if deep.any():
        bins = calibration_metrics(pred[deep], targets[deep], weights[deep])
        out["predictor/prefix_brier"], out["predictor/prefix_ece"] = bins["predictor/brier"], bins["predictor/ece"]
    out.update(predictor.fit(prefixes, targets, weights))
    return out
