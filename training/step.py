"""One training step, whole: the module every caller of a step goes through (the trainer, the simulation, the
benchmarks).

allocate roots -> bare rollouts -> plan and run continuations -> advantages and samples -> metrics -> the
allocator observes -> calibrate and fit the predictor -> annotate the trees (once) -> the policy update. With a fixed
policy (the simulation, the allocation benchmark) the caller passes no update and the step ends at the
annotations.

Choices where the paper is silent:
1. All randomness of a step derives from (seed, step): the allocators' generator is ``generator(seed, step)``,
   the sampling seeds of the two rollout stages are ``derive(seed, step, 0)`` and ``derive(seed, step, 1)``
   and the update's is ``derive(seed, step, 2)`` (`trace_gym.seeds`), so a resumed run repeats an
   uninterrupted one exactly on the CPU.
2. The ``oracle`` allocator reads exact success probabilities in place of the predictor's, from a collector
   that knows them (`ExactValues`, the simulation's); the predictor is still scored and fit, so its
   calibration is comparable across allocators.
3. The allocator observes the step's finished trees ({pool index: tree}, `Allocator.observe`) after the
   continuations and before the predictor's fit, so a stateful allocator (``trace_adaptive``) scores the
   values it allocated by before the predictor learns from the same outcomes.
4. Nodes with zero advantage are left out of the update when asked (``skip_zero``): they add no policy
   gradient, and the token-level normaliser then counts only the trained nodes' tokens. Each node is trained
   once, with its own prefix as context.
5. Stage 2 and its continuations are `expand`; an allocator that brings its own (`OwnExpansion`: the TRACE
   variants of training/variants.py) runs that in its place. Each step logs its anchors' realised and expected
   flips (`stages.flip_metrics`).

The viewer's annotation schema, written here from the stages' records: keys of ``node.meta`` that
``viz/viewer.py`` reads (and nothing else writes):
- ``predicted``: the success estimate Ṽ(H) the allocation saw for the prefix ending at this node (float in
  [0, 1]); stage 1's at a root, stage 2's at an open prefix; absent when the allocator chose without one.
- ``alloc``: the allocation decision taken at this node, ``{"continuations": k, "utility": u, "stage": s}``:
  ``k`` root rollouts chosen by U_root (``s == "root"``, on every started root) or ``k`` continuations chosen
  by U_pref (``s == "prefix"``, only where k > 0); ``u`` is None when no estimate was used.
- ``root_extra``: on a root, continuations spent there because the prompt had no open prefix.
- ``advantage``: the node's advantage in the policy update (trained nodes only).
Other keys (written by a user's own code) the viewer lists as they are.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.seeds import derive, generator
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import Allocator
from trace_gym.training.allocation.metrics import tree_metrics
from trace_gym.training.allocation.predictor import Predictor, Prefix
from trace_gym.training.allocation.stages import (
    ContinuationPlan,
    RootAllocation,
    ValueFn,
    allocate_roots,
    fit_predictor,
    flip_metrics,
    plan_continuations,
)
from trace_gym.training.config import AdvantageMethod, StepBudget
from trace_gym.training.rollout.collector import Collector, CollectStats, context_ids
from trace_gym.training.update.advantages import tree_advantages
from trace_gym.training.update.samples import Sample
from trace_gym.tree import RolloutTree

SCHEMA_KEYS = ("predicted", "alloc", "root_extra", "advantage")

Update = Callable[[Sequence[Sample], int], Mapping[str, float]]
"""The policy update: (the step's samples, its seed) -> loss metrics (`Learner.update` with the pad id bound)."""


@runtime_checkable
class ExactValues(Protocol):
    """A collector whose environment knows the true success probability of any prefix (the simulation)."""

    def true_values(self, prefixes: Sequence[Prefix]) -> np.ndarray: ...


class StageTimer:
    """``with timer("stage"):`` accumulates ``time/<stage>_s``; `metrics()` adds ``time/step_s`` since creation."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def __call__(self, name: str) -> StageTimer:
        self._name, self._start = name, time.perf_counter()
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._start

    def metrics(self) -> dict[str, float]:
        out = {f"time/{k}_s": v for k, v in self.times.items()}
        out["time/step_s"] = time.perf_counter() - self.t0
        return out


@dataclass(frozen=True)
class StepSamples:
    """The policy update's input: one `Sample` per trained node with recorded tokens, and every trained node's
    advantage by task id and node id (zeros included, for metrics and the viewer)."""

    samples: list[Sample]
    advantages: dict[str, dict[int, float]]


@dataclass(frozen=True)
class Expansion:
    """Stage 2 after it ran: the root allocation (stage 1's, with any roots stage 2 added), the plan, the work of
    its collector calls, each tree's size before them (``first_new``, for `flip_metrics`) and its own metrics."""

    roots: RootAllocation
    plan: ContinuationPlan
    stats: CollectStats
    first_new: dict[str, int]
    metrics: dict[str, float]


def expand(allocator: Allocator, collector: Collector, values: ValueFn, roots: RootAllocation, budget: StepBudget,
           rng: np.random.Generator, *, seed: int, step: int) -> Expansion:
    """The paper's stage 2: plan continuations over the open prefixes of the bare trees and run them."""
    plan = plan_continuations(allocator, values, collector.trees, roots, budget, rng)
    first_new = {tid: len(tree) for tid, tree in collector.trees.items()}
    stats = collector.continuations(plan.counts(), seed=derive(seed, step, 1))
    return Expansion(roots, plan, stats, first_new, {})


@runtime_checkable
class OwnExpansion(Protocol):
    """An allocator with its own stage 2, run in place of `expand` (choice 5)."""

    def expand(self, collector: Collector, values: ValueFn, roots: RootAllocation, budget: StepBudget,
               rng: np.random.Generator, *, seed: int, step: int) -> Expansion: ...


@dataclass
class StepResult:
    """What a step collected: its trees (task id -> tree, annotated), the stages' records, work and metrics."""

    trees: dict[str, RolloutTree]
    roots: RootAllocation
    plan: ContinuationPlan
    samples: StepSamples
    stats: CollectStats
    metrics: dict[str, Any]


def take_step(collector: Collector, allocator: Allocator, predictor: Predictor, pool: Sequence[Task],
              budget: StepBudget, *, seed: int, step: int, advantage: AdvantageMethod = "tree_grpo",
              update: Update | None = None, skip_zero: bool = True, timer: StageTimer | None = None,
              predictor_target: str = "leaves") -> StepResult:
    """Allocate over the candidate ``pool``, roll out and expand through ``collector``, score and fit
    ``predictor`` on the fresh trees (targets: ``predictor_target``), build the update's samples and, given
    ``update``, update the policy. ``timer`` collects time/allocate_s, rollout_s, expand_s, predictor_s and
    update_s."""
    rng = generator(seed, step)
    timer = timer if timer is not None else StageTimer()
    exact = collector.true_values if isinstance(collector, ExactValues) else None
    if allocator.oracle and exact is None:
        raise ConfigError(f"expected a collector with exact success values for the oracle allocator, got "
                          f"{type(collector).__name__}; fix: use the oracle with simulation.SimCollector only")
    values = exact if allocator.oracle and exact is not None else predictor.predict
    with timer("allocate"):
        roots = allocate_roots(allocator, values, pool, budget, rng)
    collector.begin_step()
    with timer("rollout"):
        stats = collector.bare_rollouts(roots.counts, seed=derive(seed, step, 0))
    with timer("expand"):  # choice 5
        run = allocator.expand if isinstance(allocator, OwnExpansion) else functools.partial(expand, allocator)
        expansion = run(collector, values, roots, budget, rng, seed=seed, step=step)
    roots, plan = expansion.roots, expansion.plan
    stats += expansion.stats
    trees = collector.trees
    samples = build_samples(trees, advantage, skip_zero)
    metrics: dict[str, Any] = {**roots.metrics(), **plan.metrics(), **expansion.metrics,
                               **stats.metrics("rollout/"), "alloc/budget": float(stats.trajectories)}
    metrics.update(tree_metrics(list(trees.values()), [samples.advantages[tid] for tid in trees]))
    metrics.update(flip_metrics(trees, plan, expansion.first_new))
    # Before the fit (choice 3): an allocator that learns from outcomes sees this step's trees by pool index.
    metrics.update(allocator.observe({i: trees[t.id] for i, t in enumerate(pool) if t.id in trees}))
    with timer("predictor"):
        metrics.update(fit_predictor(predictor, list(trees.values()), exact, predictor_target))
    annotate(trees, roots, plan, samples)
    if update is not None:
        with timer("update"):
            metrics.update(update(samples.samples, derive(seed, step, 2)))
    return StepResult(trees, roots, plan, samples, stats, metrics)


def build_samples(trees: Mapping[str, RolloutTree], method: AdvantageMethod, skip_zero: bool = True) -> StepSamples:
    """Tree-aware advantages of every node, and a sample per node that has tokens and logprobs (choice 4)."""
    samples: list[Sample] = []
    advantages: dict[str, dict[int, float]] = {}
    for tid, tree in trees.items():
        advantages[tid] = tree_advantages(tree, method)
        for node_id, adv in advantages[tid].items():
            node = tree[node_id]
            if not node.token_ids or not node.logprobs or (skip_zero and abs(adv) < 1e-8):
                continue
            samples.append(Sample(context_ids(tree, node_id), list(node.token_ids), list(node.logprobs), adv))
    return StepSamples(samples, advantages)


def annotate(trees: Mapping[str, RolloutTree], roots: RootAllocation | None = None,
             plan: ContinuationPlan | None = None, samples: StepSamples | None = None) -> None:
    """Write the records' decisions into ``trees`` (task id -> tree) under the keys of the module docstring."""
    for tid, tree in trees.items():
        meta = tree.root.meta
        if roots is not None:
            v = roots.value(tid)
            if v is not None:
                meta["predicted"] = v
            meta["alloc"] = {"continuations": roots.counts.get(tid, 0), "utility": roots.utility(tid),
                             "stage": "root"}
        if plan is not None and plan.root_extra.get(tid):
            meta["root_extra"] = plan.root_extra[tid]
        if samples is not None:
            for node_id, adv in samples.advantages.get(tid, {}).items():
                tree[node_id].meta["advantage"] = adv
    if plan is None:
        return
    for choice in plan.prefixes:
        meta = trees[choice.task_id][choice.node_id].meta
        if choice.value is not None:
            meta["predicted"] = choice.value
        if choice.continuations:
            meta["alloc"] = {"continuations": choice.continuations, "utility": choice.utility, "stage": "prefix"}
