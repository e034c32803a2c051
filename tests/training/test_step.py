"""The shared step over any collector: budget spent through it, records annotated, seeds from (seed, step)."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.environments.math.env import ArithmeticEnv
from trace_gym.errors import ConfigError
from trace_gym.training.allocation.allocators import AdaptiveAllocator, make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor
from trace_gym.training.config import StepBudget
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.simulation import SimCollector, make_tasks, true_value, value_at
from trace_gym.training.step import StageTimer, take_step

TASKS = make_tasks(48, seed=4)
BUDGET = StepBudget(roots=8, multiplier=2)


def sim_step(name: str = "trace", seed: int = 0, step: int = 1, predictor=None):
    predictor = predictor or FeaturePredictor(dim=512)
    return take_step(SimCollector(TASKS), make_allocator(name, group_size=4, cap=4), predictor, TASKS[:24], BUDGET,
                     seed=seed, step=step)


def test_the_step_spends_its_records_through_the_collector():
    result = sim_step()
    assert sum(result.roots.counts.values()) == 8 and list(result.trees) == list(result.roots.counts)
    assert result.stats.trajectories == BUDGET.total == result.metrics["alloc/budget"]
    for tid, tree in result.trees.items():
        extra = sum(k for (t, _), k in result.plan.counts().items() if t == tid)
        assert tree.leaf_count() == result.roots.counts[tid] + extra  # one leaf per trajectory


def test_the_step_annotates_its_trees_for_the_viewer():
    result = sim_step()
    for tid, tree in result.trees.items():
        assert tree.root.meta["alloc"] == {"continuations": result.roots.counts[tid],
                                           "utility": result.roots.utility(tid), "stage": "root"}
    spent = {(c.task_id, c.node_id): c.continuations for c in result.plan.prefixes if c.continuations}
    marked = {(tid, n.id): n.meta["alloc"]["continuations"] for tid, t in result.trees.items() for n in t.nodes[1:]
              if "alloc" in n.meta}
    assert marked == spent


def test_the_same_seed_and_step_repeat_a_step_and_another_step_differs():
    def trees(step: int) -> list[dict]:
        return [t.to_dict() for t in sim_step(step=step).trees.values()]

    assert trees(3) == trees(3) != trees(4)


def test_the_oracle_reads_exact_values_and_the_predictor_is_still_fit():
    predictor = FeaturePredictor(dim=512)
    result = sim_step("oracle", predictor=predictor)
    assert result.metrics["predictor/examples"] > 0 and np.any(predictor.w != 0)
    assert "predictor/brier_true" in result.metrics
    by_id = {t.id: t for t in TASKS}
    assert [result.roots.value(t.id) for t in TASKS[:24]] == [value_at(t, 0, 0) for t in TASKS[:24]]
    for c in result.plan.prefixes:  # stage 2 saw the exact value of each prefix too
        tree = result.trees[c.task_id]
        assert c.value == pytest.approx(true_value(by_id[c.task_id], tree.actions(c.node_id)))


def test_the_oracle_refuses_a_collector_without_exact_values():
    env = ArithmeticEnv(n_tasks=8)
    collector = TreeCollector(ExpertPolicy(env.expert()), lambda: ArithmeticEnv(n_tasks=8), env.tasks,
                              SamplingParams(), workers=1)
    try:
        with pytest.raises(ConfigError, match="exact success values for the oracle"):
            take_step(collector, make_allocator("oracle"), FeaturePredictor(dim=512), env.tasks, StepBudget(4, 1),
                      seed=0, step=1)
    finally:
        collector.close()
        env.close()


def test_the_step_times_its_stages():
    timer = StageTimer()
    take_step(SimCollector(TASKS), make_allocator("trace", cap=4), FeaturePredictor(dim=512), TASKS[:24], BUDGET,
              seed=0, step=1, timer=timer)
    assert {"time/allocate_s", "time/rollout_s", "time/expand_s", "time/predictor_s"} <= set(timer.metrics())


def test_the_allocator_observes_the_steps_trees_by_pool_index_before_the_predictor_fits():
    calls: list[tuple[str, object]] = []

    class Observing(AdaptiveAllocator):
        def observe(self, trees):
            calls.append(("observe", {i: t.task_id for i, t in trees.items()}))
            return super().observe(trees)

    class Fitting(FeaturePredictor):
        def fit(self, prefixes, targets, weights):
            calls.append(("fit", len(prefixes)))
            return super().fit(prefixes, targets, weights)

    pool = TASKS[:24]
    result = take_step(SimCollector(TASKS), Observing(group_size=4, cap=4), Fitting(dim=512), pool, BUDGET,
                       seed=0, step=1)
    assert [c[0] for c in calls] == ["observe", "fit"]
    assert calls[0][1] == {i: t.id for i, t in enumerate(pool) if t.id in result.trees} and calls[0][1]
    # trust 0: the 8 roots are two uniform groups of 4, each recorded for the trust
    assert result.metrics["alloc/trust_records"] == 2.0 and result.metrics["alloc/trust"] == 0.0
