"""The TRACE variants that are not in the paper, each an allocator under its own name (`make_allocator` builds
them from ``allocators.VARIANTS``); the paper's method and its baselines are training/allocation/allocators.py
and the step (training/step.py). Two changes to stage 2, each on its own and together:

- ``root_anchor`` (``trace_root``): a prompt whose bare rollouts all agree offers its root as one more anchor,
  scored by the same 1 - q^k with the root's prediction and the agreed reward. In a task decided at turn 1
  every open prefix lies past the decision, while a fresh rollout from the root can still flip.
- ``refund`` (``trace_refund``): after stage 2, continuations are handed back to stage 1 in pairs, from the
  smallest marginal gain q^k(1 - q) up, while a pair of root rollouts on prompts of the pool that stage 1 left
  out would add more expected mixed groups (`refund_plan`): the paper's solver spends its whole budget even
  where every gain is ~0.

``trace_plus`` has both; ``trace_root_uniform`` is ``trace_root`` with uniform prefixes over the same anchors, the
prefix ablation of ``trace_root`` at the same roots. A variant runs its own stage 2 in the step
(`step.OwnExpansion`); stage 1 is trace's.

Choices where the paper is silent (it has neither change):
1. A root anchor has the agreed reward as r and the root's prediction as v; it competes with the open prefixes
   of its prompt for the prompt's budget. Root anchors are `PrefixChoice`s at node 0, so the step's flip
   metrics report them apart (``alloc/root_anchor_*``).
2. The refund compares the two smallest marginal gains q^t(1 - q) of the planned continuations with what two
   more root rollouts on the pool's unchosen prompts add at the root stage's optimum
   (`solvers.root_values_by_budget`), and stops at the first pair that does not gain. It needs the values both
   stages saw, so it asks for active roots and prefixes.
3. The refunded roots run as bare rollouts of their prompts (no continuations) after the continuations, sampled
   with ``derive(seed, step, 4)``, and join the step's root allocation; their metrics are ``alloc/refund*``.
4. The flip scale (opt-in, ``alloc.flip_scale``; `FlipScale`): the predictor's 1 - q^k at a prefix expects about
   twice the flips it gets (docs/results.md), because the rollout's outcome r tells more about its prefix than
   the text does; a root anchor's and a root rollout's gains come from the root's value, which that outcome does
   not inform. Both comparisons (root anchors against prefixes, the refund's pairs) weigh a prefix's gain by
   realised / predicted flips of the depth >= 1 anchors, per bare outcome r ∈ {0, 1}, measured on the last
   ``window`` steps' trees and shrunk towards 1 by a prior worth ``prior`` predicted flips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.seeds import derive
from trace_gym.training.allocation.allocators import PrefixMode, StagedAllocator
from trace_gym.training.allocation.solvers import (
    prefix_same_outcome,
    prefix_utility,
    root_values_by_budget,
    solve_roots,
)
from trace_gym.training.allocation.stages import (
    ContinuationPlan,
    GainScale,
    PrefixChoice,
    RootAllocation,
    ValueFn,
    continuation_outcomes,
    open_anchors,
    plan_continuations,
)
from trace_gym.training.config import StepBudget
from trace_gym.training.rollout.collector import Collector
from trace_gym.training.step import Expansion
from trace_gym.tree import RolloutTree

# name -> (stage-2 mode, root_anchor, refund); stage 1 is trace's active roots
VARIANTS: dict[str, tuple[PrefixMode, bool, bool]] = {
    "trace_root": ("active", True, False),
    "trace_refund": ("active", False, True),
    "trace_plus": ("active", True, True),
    "trace_root_uniform": ("uniform", True, False),
}


@dataclass(frozen=True)
class Refund:
    """What `refund_plan` handed back: ``counts[task id] = m`` root rollouts on prompts stage 1 left out, the
    expected mixed groups they add (``gain``) and the expected flips the continuations they replace would
    have found (``cost``)."""

    counts: dict[str, int]
    gain: float
    cost: float

    def metrics(self) -> dict[str, float]:
        return {"alloc/refund": float(sum(self.counts.values())), "alloc/refund_prompts": float(len(self.counts)),
                "alloc/refund_gain": self.gain, "alloc/refund_cost": self.cost}


NO_REFUND = Refund({}, 0.0, 0.0)


def flip_ratio(realised: np.ndarray, predicted: np.ndarray, prior: float) -> np.ndarray:
    """(realised + prior) / (predicted + prior): realised over predicted flips, 1 without data and shrunk towards 1
    while predicted flips are few next to ``prior`` (choice 4)."""
    return (np.asarray(realised, dtype=np.float64) + prior) / (np.asarray(predicted, dtype=np.float64) + prior)


class FlipScale:
    """Realised over predicted flips at depth >= 1 anchors, per bare outcome r ∈ {0, 1} (choice 4); called as a
    `stages.GainScale`, 1 at a root anchor (node 0) and the scale of its r (linear in r between them) elsewhere.

    `expect` records a plan's anchors with the values it saw once its continuations ran; `observe` scores them on
    the finished trees. One record per step: realised and predicted flips for r = 0 and for r = 1."""

    def __init__(self, prior: float = 8.0, window: int = 8):
        if prior <= 0 or window < 1:
            raise ConfigError(f"expected a prior > 0 and a window >= 1, got {prior}, {window}")
        self.prior, self.window = prior, window
        self.records: list[list[float]] = []  # per step: [realised r=0, predicted r=0, realised r=1, predicted r=1]
        self._pending: list[tuple[PrefixChoice, int]] = []  # (anchor, its tree's first continuation id)

    def scale(self) -> np.ndarray:
        """(2,): the scale for r = 0 and for r = 1."""
        sums = np.sum(self.records, axis=0) if self.records else np.zeros(4)
        return flip_ratio(sums[[0, 2]], sums[[1, 3]], self.prior)

    def __call__(self, nodes: Sequence[int], rewards: np.ndarray) -> np.ndarray:
        s0, s1 = self.scale()
        r = np.clip(np.asarray(rewards, dtype=np.float64), 0.0, 1.0)
        return np.where(np.asarray(nodes) == 0, 1.0, s0 * (1.0 - r) + s1 * r)

    def expect(self, plan: ContinuationPlan, first_new: Mapping[str, int]) -> None:
        """Remember ``plan``'s depth >= 1 anchors that received continuations and were valued."""
        self._pending = [(c, first_new.get(c.task_id, 0)) for c in plan.prefixes
                         if c.node_id != 0 and c.continuations and c.value is not None]

    def observe(self, trees: Mapping[str, RolloutTree]) -> dict[str, float]:
        """Score the expected anchors on ``trees`` (task id -> finished tree); returns ``alloc/flip_scale_*``."""
        row = np.zeros(4)
        for c, first in self._pending:
            if c.task_id not in trees:
                continue
            outcomes = continuation_outcomes(trees[c.task_id], c.node_id, first)
            r = min(max(c.reward, 0.0), 1.0)
            share = np.array([1.0 - r, r])
            row[[0, 2]] += share * float(any(o != c.reward for o in outcomes))
            row[[1, 3]] += share * float(prefix_utility(r, min(max(float(c.value or 0.0), 0.0), 1.0),
                                                        c.continuations))
        self._pending = []
        if row[1] + row[3] > 0:
            self.records = [*self.records, row.tolist()][-self.window:]
        s = self.scale()
        return {"alloc/flip_scale_0": float(s[0]), "alloc/flip_scale_1": float(s[1]),
                "alloc/flip_scale_realised": float(row[0] + row[2]),
                "alloc/flip_scale_predicted": float(row[1] + row[3])}

    def state_dict(self) -> dict[str, Any]:
        """The records (the pending anchors belong to a step in flight and are not kept)."""
        return {"records": [list(r) for r in self.records]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` gave."""
        self.records = [[float(x) for x in r] for r in state.get("records", [])][-self.window:]


def bare_outcomes(tree: RolloutTree) -> list[float]:
    """The reward of each finished bare rollout (a root child followed through first-created children)."""
    out = []
    for c in tree.root.children:
        node = tree[c]
        while node.children:
            node = tree[min(node.children)]
        if node.is_terminal:
            out.append(float(node.reward))
    return out


def root_anchors(tree: RolloutTree) -> tuple[list[int], np.ndarray]:
    """The open prefixes (`stages.open_anchors`) and, when every bare rollout agrees, the root first (choice 1)."""
    nodes, rewards = open_anchors(tree)
    outcomes = bare_outcomes(tree)
    if outcomes and min(outcomes) == max(outcomes):
        return [0, *nodes], np.concatenate([[float(np.clip(outcomes[0], 0.0, 1.0))], rewards])
    return nodes, rewards


def refund_plan(plan: ContinuationPlan, roots: RootAllocation, cap: int,
                scale: GainScale | None = None) -> tuple[ContinuationPlan, Refund]:
    """Choice 2: ``plan`` with its least useful continuations removed in pairs, and the root rollouts on the
    pool's unchosen prompts they pay for. Needs the values both stages saw; without them nothing moves. With
    ``scale`` (choice 4) each anchor's marginal gains are weighed by it."""
    units: list[tuple[float, int]] = []  # (marginal gain, index of the choice in plan.prefixes)
    for i, c in enumerate(plan.prefixes):
        if c.value is None:
            continue
        q = float(prefix_same_outcome(c.reward, min(max(c.value, 0.0), 1.0)))
        s = float(scale([c.node_id], np.array([c.reward]))[0]) if scale is not None else 1.0
        units += [(s * q**t * (1.0 - q), i) for t in range(c.continuations)]
    rest = [j for j, tid in enumerate(roots.task_ids) if tid not in roots.counts]
    if roots.values is None or not rest or len(units) < 2:
        return plan, NO_REFUND
    values = np.clip(roots.values[rest], 0.0, 1.0)
    most = 2 * (len(units) // 2)
    best = root_values_by_budget(values, most, cap)
    units.sort()
    moved, cost = 0, 0.0
    while moved + 2 <= most and np.isfinite(best[moved + 2]):
        pair = units[moved][0] + units[moved + 1][0]
        if best[moved + 2] - best[moved] <= pair + 1e-12:
            break
        cost += pair
        moved += 2
    if moved == 0:
        return plan, NO_REFUND
    removed = np.bincount([i for _, i in units[:moved]], minlength=len(plan.prefixes))
    prefixes = tuple(PrefixChoice(c.task_id, c.node_id, c.reward, c.value, c.continuations - int(removed[i]))
                     for i, c in enumerate(plan.prefixes))
    m = solve_roots(values, moved, cap)
    counts = {roots.task_ids[rest[j]]: int(m[j]) for j in np.flatnonzero(m)}
    return ContinuationPlan(prefixes, plan.root_extra), Refund(counts, float(best[moved]), cost)


@dataclass(frozen=True)
class VariantAllocator(StagedAllocator):
    """trace's stage 1 and a stage 2 with root anchors (``root_anchor``) and/or the refund (``refund``)."""

    root_anchor: bool = False
    refund: bool = False
    flip_scale: FlipScale | None = None  # choice 4 (None: the gains as the predictor has them)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.refund and not (self.roots == "active" and self.prefixes == "active"):
            raise ConfigError(f"expected active roots and prefixes for a refund, got {self.roots}/{self.prefixes}: "
                              "the refund compares both stages' predicted gains")
        if self.flip_scale is not None and self.prefixes != "active":
            raise ConfigError(f"expected active prefixes for a flip scale, got {self.prefixes}: uniform prefixes "
                              "read no gain to scale; fix: drop alloc.flip_scale")

    def plan(self, values: ValueFn, trees: Mapping[str, RolloutTree], roots: RootAllocation, budget: StepBudget,
             rng: np.random.Generator) -> tuple[ContinuationPlan, Refund]:
        """Stage 2 over the anchors (with agreeing roots when ``root_anchor``), then the refund when ``refund``;
        prefix gains weighed by the flip scale when there is one."""
        plan = plan_continuations(self, values, trees, roots, budget, rng,
                                  root_anchors if self.root_anchor else open_anchors, self.flip_scale)
        return refund_plan(plan, roots, self.cap, self.flip_scale) if self.refund else (plan, NO_REFUND)

    def expand(self, collector: Collector, values: ValueFn, roots: RootAllocation, budget: StepBudget,
               rng: np.random.Generator, *, seed: int, step: int) -> Expansion:
        """The step's stage 2 (`step.expand`) with this variant's plan, then the refunded roots (choice 3)."""
        plan, refund = self.plan(values, collector.trees, roots, budget, rng)
        first_new = {tid: len(tree) for tid, tree in collector.trees.items()}
        stats = collector.continuations(plan.counts(), seed=derive(seed, step, 1))
        if self.flip_scale is not None:
            self.flip_scale.expect(plan, first_new)
        if refund.counts:
            stats += collector.bare_rollouts(refund.counts, seed=derive(seed, step, 4))
            roots = RootAllocation(roots.task_ids, roots.values, {**roots.counts, **refund.counts})
        return Expansion(roots, plan, stats, first_new, refund.metrics())

    def observe(self, trees: Mapping[int, Any]) -> dict[str, float]:
        """The flip scale scores this step's anchors on the finished trees ({pool index: tree}); without one,
        nothing."""
        if self.flip_scale is None:
            return {}
        return self.flip_scale.observe({tree.task_id: tree for tree in trees.values()})

    def state_dict(self) -> dict[str, Any]:
        """The flip scale's records ({} without one)."""
        return {"flip_scale": self.flip_scale.state_dict()} if self.flip_scale is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` gave."""
        if self.flip_scale is not None and "flip_scale" in state:
            self.flip_scale.load_state_dict(state["flip_scale"])


def make_variant(name: str, group_size: int = 8, cap: int = 16,
                 flip_scale_prior: float | None = None) -> VariantAllocator:
    """The variant ``name`` (one of ``VARIANTS``), with a fresh `FlipScale` of that prior when one is given."""
    if name not in VARIANTS:
        raise ConfigError(f"expected a TRACE variant in {tuple(VARIANTS)}, got {name!r}")
    prefixes, root_anchor, refund = VARIANTS[name]
    scale = FlipScale(flip_scale_prior) if flip_scale_prior is not None else None
    return VariantAllocator(name, "active", prefixes, False, group_size, cap, root_anchor, refund, scale)
