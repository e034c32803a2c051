import math

import numpy as np
import pytest

from tests.training.sim_env import SimEnv
from trace_gym.checker import check_trace_env
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix
from trace_gym.training.config import ALLOCATORS, StepBudget
from trace_gym.training.simulation import (
    BAD_ACTION,
    GOOD_ACTION,
    SimCollector,
    make_tasks,
    run_simulation,
    scripted_action,
    true_value,
    value_at,
)
from trace_gym.training.step import take_step


def _task(p, need, horizon):
    return Task("t", "p", meta={"p_good": p, "need": need, "horizon": horizon})


def test_value_hand_cases():
    task = _task(0.5, 2, 3)
    # need 2 good of 3 moves at p = 1/2: P(Bin(3, 1/2) >= 2) = 4/8
    assert value_at(task, 0, 0) == pytest.approx(0.5)
    assert true_value(task, [GOOD_ACTION.format(t=1)]) == pytest.approx(0.75)  # 1 more of 2
    assert true_value(task, [BAD_ACTION.format(t=1)]) == pytest.approx(0.25)  # 2 of 2
    assert true_value(task, [BAD_ACTION.format(t=1), BAD_ACTION.format(t=2)]) == 0.0


def test_value_is_the_mean_over_the_next_move():
    for task in make_tasks(20, horizon=5, seed=3):
        p, need, horizon = task.meta["p_good"], task.meta["need"], task.meta["horizon"]
        for t in range(horizon):
            for g in range(min(t, need - 1) + 1):
                if t - g > horizon - need:
                    continue
                mean = p * value_at(task, t + 1, g + 1) + (1 - p) * value_at(task, t + 1, g)
                assert value_at(task, t, g) == pytest.approx(mean)


def test_true_value_matches_monte_carlo_of_the_env():
    env = SimEnv(tasks=[_task(0.35, 2, 4)])
    rng = np.random.default_rng(0)
    wins = 0
    for _ in range(4000):
        env.reset(seed=int(rng.integers(1 << 30)))
        done, reward = False, 0.0
        while not done:
            _, reward, term, trunc, _ = env.step(scripted_action(env.task, env.moves, rng))
            done = term or trunc
        wins += reward
    assert wins / 4000 == pytest.approx(value_at(env.tasks[0], 0, 0), abs=0.025)


def test_sim_env_passes_the_conformance_checker():
    check_trace_env(lambda: SimEnv(n_tasks=8), seed=0)


@pytest.mark.parametrize("name", ALLOCATORS)
def test_simulated_step_spends_the_budget_and_builds_finished_trees(name):
    tasks = make_tasks(64, seed=1)
    step = take_step(SimCollector(tasks), make_allocator(name, group_size=4), FeaturePredictor(dim=512), tasks[:40],
                     StepBudget(16, 2), seed=0, step=1)
    assert step.metrics["alloc/budget"] == 48 == step.metrics["rollout/trajectories"]
    for tree in step.trees.values():
        assert all(n.children or n.is_terminal for n in tree.nodes)


def test_sim_collector_knows_the_exact_value_of_every_prefix_it_played():
    tasks = make_tasks(8, seed=2)
    collector = SimCollector(tasks)
    collector.begin_step()
    collector.bare_rollouts({t.id: 2 for t in tasks}, seed=5)
    for tid, tree in collector.trees.items():
        prefixes = [Prefix.from_tree(tree, n.id) for n in tree.nodes]
        expected = [true_value(collector.tasks[tid], tree.actions(n.id)) for n in tree.nodes]
        np.testing.assert_allclose(collector.true_values(prefixes), expected)
        for leaf in tree.leaves():  # a finished episode's value is its outcome
            assert collector.true_values([Prefix.from_tree(tree, leaf.id)])[0] == leaf.reward


def test_sim_collector_repeats_its_trees_for_the_same_seed():
    tasks = make_tasks(6, seed=3)

    def play(seed: int) -> list[dict]:
        collector = SimCollector(tasks)
        collector.begin_step()
        collector.bare_rollouts({t.id: 3 for t in tasks}, seed=seed)
        collector.continuations({(tasks[0].id, 0): 2}, seed=seed + 1)
        return [t.to_dict() for t in collector.trees.values()]

    assert play(7) == play(7) != play(8)


def _mean_metric(name, key, seeds=(0, 1)):
    tasks = make_tasks(200, seed=7)
    vals = []
    for seed in seeds:
        hist = run_simulation(make_allocator(name, group_size=8), FeaturePredictor(dim=2048), tasks,
                              StepBudget(32, 2), steps=25, pool_size=96, seed=seed)
        vals += [h[key] for h in hist[5:]]
    return float(np.mean(vals))


def test_trace_beats_grpo_and_oracle_beats_trace_on_effective_ratio():
    grpo = _mean_metric("grpo", "alloc/effective_ratio")
    trace = _mean_metric("trace", "alloc/effective_ratio")
    oracle = _mean_metric("oracle", "alloc/effective_ratio")
    assert grpo < trace <= oracle + 0.02


def test_the_simulation_records_each_moves_logprob_only_when_asked() -> None:
    tasks = make_tasks(4, seed=0)
    for logprobs in (False, True):
        collector = SimCollector(tasks, logprobs=logprobs)
        collector.begin_step()
        collector.bare_rollouts({tasks[0].id: 2}, seed=0)
        tree = collector.trees[tasks[0].id]
        leaf = tree.leaves()[0]
        prefix = Prefix.from_tree(tree, leaf.id)
        assert (prefix.logprobs != ()) == logprobs
        if logprobs:
            p = tasks[0].meta["p_good"]
            good = "safe path" in (leaf.action or "")
            assert leaf.logprobs == pytest.approx([math.log(p if good else 1 - p)])
