"""One step's rollout half over any `Collector`: the driver the trainer, the simulation and the benchmarks share.

allocate roots -> bare rollouts -> plan and run continuations -> metrics -> the allocator observes -> calibrate
and fit the predictor -> annotate the trees. The policy update is the trainer's (`Trainer.step`); with a fixed
policy (the simulation, the allocation benchmark) this is the whole step.

Choices where the paper is silent:
1. All randomness of a step derives from (seed, step): the allocators' generator is
   ``generator(seed, step)`` and the sampling seeds of the two rollout stages are
   ``derive(seed, step, 0)`` and ``derive(seed, step, 1)`` (`trace_gym.seeds`), so a resumed run repeats an
   uninterrupted one exactly on the CPU.
2. The ``oracle`` allocator reads exact success probabilities in place of the predictor's, from a collector
   that knows them (`ExactValues`, the simulation's); the predictor is still scored and fit, so its
   calibration is comparable across allocators.
3. The allocator observes the step's finished trees ({pool index: tree}, `Allocator.observe`) after the
   continuations and before the predictor's fit, so a stateful allocator (``trace_adaptive``) scores the
   values it allocated by before the predictor learns from the same outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.seeds import derive, generator
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import Allocator, StepBudget
from trace_gym.training.allocation.metrics import tree_metrics
from trace_gym.training.allocation.predictor import Predictor, Prefix
from trace_gym.training.allocation.stages import (
    ContinuationPlan,
    RootAllocation,
    allocate_roots,
    fit_predictor,
    plan_continuations,
)
from trace_gym.training.driver.progress import StageTimer
from trace_gym.training.rollout.collector import Collector, CollectStats
from trace_gym.training.update.advantages import AdvantageMethod
from trace_gym.training.viz.annotations import annotate
from trace_gym.tree import RolloutTree


@runtime_checkable
class ExactValues(Protocol):
    """A collector whose environment knows the true success probability of any prefix (the simulation)."""

    def true_values(self, prefixes: Sequence[Prefix]) -> np.ndarray: ...


@dataclass
class StepResult:
    """What a step collected: its trees (task id -> tree, annotated), the stages' records, work and metrics."""

    trees: dict[str, RolloutTree]
    roots: RootAllocation
    plan: ContinuationPlan
    stats: CollectStats
    metrics: dict[str, Any]


def take_step(collector: Collector, allocator: Allocator, predictor: Predictor, pool: Sequence[Task],
              budget: StepBudget, *, seed: int, step: int, advantage: AdvantageMethod = "tree_grpo",
              timer: StageTimer | None = None) -> StepResult:
    """Allocate over the candidate ``pool``, roll out and expand through ``collector``, then score and fit
    ``predictor`` on the fresh trees. ``timer`` collects time/allocate_s, rollout_s, expand_s, predictor_s."""
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
    with timer("expand"):
        plan = plan_continuations(allocator, values, collector.trees, roots, budget, rng)
        stats += collector.continuations(plan.counts(), seed=derive(seed, step, 1))
    trees = collector.trees
    metrics: dict[str, Any] = {**roots.metrics(), **plan.metrics(), **stats.metrics("rollout/"),
                               "alloc/budget": float(stats.trajectories)}
    metrics.update(tree_metrics(list(trees.values()), advantage))
    # Before the fit (choice 3): an allocator that learns from outcomes sees this step's trees by pool index.
    metrics.update(allocator.observe({i: trees[t.id] for i, t in enumerate(pool) if t.id in trees}))
    with timer("predictor"):
        metrics.update(fit_predictor(predictor, list(trees.values()), exact))
    annotate(trees, roots, plan)
    return StepResult(trees, roots, plan, stats, metrics)
