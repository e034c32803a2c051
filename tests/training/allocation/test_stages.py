"""The step's stages as pure functions: typed records that spend the budget, written nowhere into the trees."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix, training_examples
from trace_gym.training.allocation.stages import (
    ContinuationPlan,
    RootAllocation,
    allocate_roots,
    fit_predictor,
    plan_continuations,
)
from trace_gym.training.config import StepBudget
from trace_gym.training.step import build_samples
from trace_gym.tree import RolloutTree

POOL = [Task(id=f"t{i}", prompt=f"prompt t{i}") for i in range(4)]


def bare_trees(rewards: dict[str, list[float | None]]) -> dict[str, RolloutTree]:
    """Two-turn bare rollouts per task, final rewards as given; None: the rollout ends after one turn."""
    trees = {}
    for tid, outcomes in rewards.items():
        tree = RolloutTree(tid, f"prompt {tid}")
        for j, r in enumerate(outcomes):
            if r is None:
                tree.add(0, f"give up {j}", "", 0.0, terminated=True)
                continue
            mid = tree.add(0, f"{tid} think {j}", f"obs {j % 2}")
            tree.add(mid.id, f"answer {j}", "", r, terminated=True)
        trees[tid] = tree
    return trees


def planned_step(seed: int = 0) -> tuple[dict[str, RolloutTree], RootAllocation, ContinuationPlan, FeaturePredictor]:
    """Stage 1 on a pool of four prompts, hand-made bare rollouts, then stage 2, as the step runs them."""
    predictor = FeaturePredictor(steps=20)
    warm = bare_trees({"t0": [1.0, 0.0], "t1": [0.0, 0.0], "t2": [1.0, 1.0], "t3": [None, None]})
    predictor.fit(*training_examples(list(warm.values())))
    allocator, budget = make_allocator("trace", cap=3), StepBudget(roots=8, multiplier=2)
    rng = np.random.default_rng(seed)
    roots = allocate_roots(allocator, predictor.predict, POOL, budget, rng)
    outcomes = {"t0": [1.0, 0.0, 1.0], "t1": [0.0, 1.0, 0.0], "t2": [1.0, 1.0, 0.0], "t3": [None, None, None]}
    trees = bare_trees({tid: outcomes[tid][:m] for tid, m in roots.counts.items()})
    plan = plan_continuations(allocator, predictor.predict, trees, roots, budget, rng)
    return trees, roots, plan, predictor


def test_root_allocation_records_the_pool_values_and_utilities():
    _, roots, _, predictor = planned_step()
    assert roots.task_ids == tuple(t.id for t in POOL) and sum(roots.counts.values()) == 8
    expected = predictor.predict([Prefix(t.id, t.prompt) for t in POOL])
    np.testing.assert_allclose(roots.values, expected)
    for tid, m in roots.counts.items():
        v = roots.value(tid)
        assert m >= 2 and roots.utility(tid) == pytest.approx(1 - v**m - (1 - v) ** m)
    assert roots.metrics()["alloc/roots"] == 8


def test_uniform_roots_record_no_values():
    roots = allocate_roots(make_allocator("grpo", group_size=2), lambda ps: pytest.fail("no values needed"), POOL,
                           StepBudget(roots=4, multiplier=0), np.random.default_rng(0))
    assert roots.values is None and roots.value("t0") is None and roots.utility("t0") is None
    assert sum(roots.counts.values()) == 4


def test_continuation_plan_spends_n_per_root_rollout_and_scores_each_prefix():
    trees, roots, plan, predictor = planned_step()
    assert sum(plan.counts().values()) == 2 * sum(roots.counts.values())  # N·m_i per prompt
    for c in plan.prefixes:
        tree = trees[c.task_id]
        assert c.value == pytest.approx(predictor.predict([Prefix.from_tree(tree, c.node_id)])[0])
        assert c.reward == tree.leaves(c.node_id)[0].reward  # the reward of the rollout it lies on
        q = c.reward * c.value + (1 - c.reward) * (1 - c.value)
        assert c.utility == pytest.approx(1 - q**c.continuations)


def test_a_prompt_without_open_prefixes_sends_its_budget_to_the_root():
    trees = bare_trees({"t3": [None, None]})
    roots = RootAllocation(("t3",), None, {"t3": 2})
    plan = plan_continuations(make_allocator("trace"), lambda ps: np.full(len(ps), 0.5), trees, roots,
                              StepBudget(roots=2, multiplier=3), np.random.default_rng(0))
    assert plan.prefixes == () and plan.root_extra == {"t3": 6} and plan.counts() == {("t3", 0): 6}


def test_stages_leave_the_trees_untouched():
    trees, *_ = planned_step()
    assert all(not n.meta for t in trees.values() for n in t.nodes)


def test_fit_predictor_scores_before_it_fits_and_against_exact_values():
    trees = list(bare_trees({"t0": [1.0, 0.0], "t1": [0.0, 0.0], "t2": [1.0, 1.0]}).values())
    predictor = FeaturePredictor(steps=10)
    m = fit_predictor(predictor, trees, exact=lambda ps: np.full(len(ps), 0.5))
    _, targets, weights = training_examples(trees)
    # before the first fit every prediction is 0.5: the Brier against the exact 0.5 is 0, against V̂ it is not
    assert m["predictor/brier_true"] == 0.0
    assert m["predictor/brier"] == pytest.approx(float(np.sum(weights * (0.5 - targets) ** 2) / weights.sum()))
    assert m["predictor/loss_after"] < m["predictor/loss_before"]


def record_tokens(trees, action=(1, 2), logprob=-0.5):
    """Give every tree the token record a collector with a tokenizer writes (same ids on every turn)."""
    for tree in trees.values():
        tree.root.prompt_ids = [0]
        for node in tree.nodes[1:]:
            node.token_ids, node.logprobs = list(action), [logprob] * len(action)
            node.obs_ids = None if node.is_terminal else [3]


def test_build_samples_records_every_advantage_and_skips_untrainable_nodes():
    trees, *_ = planned_step()
    record_tokens(trees)
    out = build_samples(trees, "tree_grpo", skip_zero=True)
    nonzero = [a for advs in out.advantages.values() for a in advs.values() if abs(a) > 1e-8]
    assert len(out.samples) == len(nonzero) > 0
    assert sorted(s.advantage for s in out.samples) == sorted(nonzero)
    everything = build_samples(trees, "tree_grpo", skip_zero=False)
    assert len(everything.samples) == sum(len(a) for a in out.advantages.values())
