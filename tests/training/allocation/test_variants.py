"""The TRACE variants' stage 2 (training/variants.py: root anchors, the refund to stage 1), flip accounting,
children targets and the online recalibration; and the whole step with each variant on the simulation env (budget
spent exactly)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.errors import ConfigError
from trace_gym.tasks import Task
from trace_gym.training.allocation.allocators import StagedAllocator, make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor, Prefix, children_values, training_examples
from trace_gym.training.allocation.predictor_wrappers import CalibratedPredictor
from trace_gym.training.allocation.solvers import root_utility, root_values_by_budget, solve_roots
from trace_gym.training.allocation.stages import (
    ContinuationPlan,
    PrefixChoice,
    RootAllocation,
    flip_metrics,
    plan_continuations,
)
from trace_gym.training.config import StepBudget
from trace_gym.training.simulation import SimCollector, make_tasks
from trace_gym.training.step import take_step
from trace_gym.training.variants import FlipScale, VariantAllocator, flip_ratio, make_variant, refund_plan
from trace_gym.tree import RolloutTree


def two_turn_tree(tid: str, outcomes: list[float]) -> RolloutTree:
    tree = RolloutTree(tid, f"prompt {tid}")
    for j, r in enumerate(outcomes):
        mid = tree.add(0, f"call {j}", "out")
        tree.add(mid.id, "answer", "", r, terminated=True)
    return tree


def constant(v: float):
    return lambda prefixes: np.full(len(prefixes), v)


def test_a_root_whose_bare_rollouts_agree_is_an_anchor_only_for_root_anchor_allocators() -> None:
    trees = {"agree": two_turn_tree("agree", [0.0, 0.0]), "mixed": two_turn_tree("mixed", [1.0, 0.0])}
    roots = RootAllocation(("agree", "mixed"), np.array([0.5, 0.5]), {"agree": 2, "mixed": 2})
    budget, rng = StepBudget(4, 2), np.random.default_rng(0)
    plain = plan_continuations(make_allocator("trace"), constant(0.5), trees, roots, budget, rng)
    rooted, _ = make_variant("trace_root").plan(constant(0.5), trees, roots, budget, rng)
    assert all(c.node_id != 0 for c in plain.prefixes)
    anchors = {(c.task_id, c.node_id) for c in rooted.prefixes}
    assert ("agree", 0) in anchors and ("mixed", 0) not in anchors  # a mixed root cannot flip
    for plan in (plain, rooted):  # each prompt still spends exactly m·N
        for tid in trees:
            assert sum(c.continuations for c in plan.prefixes if c.task_id == tid) == 4
    root = next(c for c in rooted.prefixes if (c.task_id, c.node_id) == ("agree", 0))
    assert root.reward == 0.0 and root.value == 0.5 and root.continuations > 0  # ties go to earlier anchors


def test_the_refund_moves_pairs_of_settled_continuations_to_the_pools_uncertain_prompts() -> None:
    # Two chosen prompts whose prefixes are settled (q ~ 1), two left out at v = 0.5 (a pair gains 0.5 each).
    choices = (PrefixChoice("a", 1, 1.0, 0.999, 3), PrefixChoice("b", 1, 1.0, 0.6, 3))
    plan = ContinuationPlan(choices, {})
    roots = RootAllocation(("a", "b", "c", "d"), np.array([0.99, 0.9, 0.5, 0.5]), {"a": 2, "b": 2})
    new, refund = refund_plan(plan, roots, cap=4)
    moved = sum(refund.counts.values())
    assert moved % 2 == 0 and moved > 0 and set(refund.counts) <= {"c", "d"}
    kept = {c.task_id: c.continuations for c in new.prefixes}
    assert sum(kept.values()) + moved == 6  # the budget is conserved
    assert kept["a"] < 3 and kept["b"] >= kept["a"]  # the settled anchor gives first
    assert refund.gain == pytest.approx(root_values_by_budget(np.array([0.5, 0.5]), moved, 4)[moved])
    # the pair it stopped at did not gain: the next two smallest units are worth at least what 2 roots add
    best = root_values_by_budget(np.array([0.5, 0.5]), 6, 4)
    assert not np.isfinite(best[moved + 2]) or best[moved + 2] - best[moved] <= 2 * 0.4 + 1e-9


def test_no_refund_without_values_or_unchosen_prompts() -> None:
    plan = ContinuationPlan((PrefixChoice("a", 1, 1.0, None, 4),), {})
    roots = RootAllocation(("a", "b"), np.array([0.9, 0.5]), {"a": 2})
    assert refund_plan(plan, roots, 4)[1].counts == {}
    full = RootAllocation(("a",), np.array([0.9]), {"a": 2})
    plan = ContinuationPlan((PrefixChoice("a", 1, 1.0, 0.999, 4),), {})
    kept, refund = refund_plan(plan, full, 4)
    assert kept == plan and refund.counts == {}


def test_a_refund_needs_both_active_stages() -> None:
    with pytest.raises(ConfigError, match="active roots and prefixes"):
        VariantAllocator("x", "uniform", "active", refund=True)


def test_the_variants_are_built_by_name_and_the_production_allocators_carry_no_variant_flag() -> None:
    for name in ("trace_root", "trace_refund", "trace_plus", "trace_root_uniform"):
        assert isinstance(make_allocator(name), VariantAllocator) and make_allocator(name).name == name
    for name in ("trace", "grpo", "pcl", "treepo", "oracle"):
        allocator = make_allocator(name)
        assert type(allocator) is StagedAllocator and not hasattr(allocator, "refund")
        assert not hasattr(allocator, "root_anchor") and not hasattr(allocator, "expand")


def test_root_values_by_budget_agree_with_the_exact_solver() -> None:
    v = np.array([0.1, 0.5, 0.7, 0.95])
    best = root_values_by_budget(v, 10, 4)
    for b in range(0, 11, 2):
        m = solve_roots(v, b, 4)
        assert best[b] == pytest.approx(float(root_utility(v, m).sum()))
    assert best[1] == -np.inf  # one rollout cannot be spent


def test_flips_count_an_anchors_own_continuations_by_depth() -> None:
    tree = two_turn_tree("t", [1.0, 0.0])
    first = len(tree)
    tree.add(1, "answer", "", 0.0, terminated=True)  # from node 1 (bare reward 1): flipped
    tree.add(3, "answer", "", 0.0, terminated=True)  # from node 3 (bare reward 0): not flipped
    tree.add(0, "call", "out")  # from the root (an agreeing-root anchor in a real plan) ...
    tree.add(len(tree) - 1, "answer", "", 1.0, terminated=True)  # ... that ended with the other outcome
    plan = ContinuationPlan((PrefixChoice("t", 1, 1.0, 0.5, 1), PrefixChoice("t", 3, 0.0, 0.9, 1),
                             PrefixChoice("t", 0, 0.0, 0.5, 1)), {})
    m = flip_metrics({"t": tree}, plan, {"t": first})
    assert (m["alloc/prefix_anchors"], m["alloc/prefix_flips"], m["alloc/prefix_flip_share"]) == (2.0, 1.0, 0.5)
    assert m["alloc/prefix_flips_expected"] == pytest.approx(0.5 + 0.9)  # 1 - q: q = 0.5, and (1 - r)(1 - v) = 0.1
    assert (m["alloc/root_anchor_anchors"], m["alloc/root_anchor_flips"]) == (1.0, 1.0)


def test_children_targets_count_an_expanded_subtree_once_at_its_ancestors() -> None:
    tree = two_turn_tree("t", [1.0, 0.0])  # root -> 1 -> 2 (1), root -> 3 -> 4 (0)
    for _ in range(3):  # three continuations from node 3, all successes
        tree.add(3, "answer", "", 1.0, terminated=True)
    values, weights = children_values(tree)
    assert values[3] == pytest.approx(0.75) and weights[3] == 4  # its own four children, once each
    assert values[0] == pytest.approx((1.0 + 0.75) / 2) and weights[0] == 2  # two root children, once each
    _, leaf_targets, _ = training_examples([tree])
    assert leaf_targets[0] == pytest.approx(4 / 5)  # the paper's V̂: four of five leaves succeed
    prefixes, targets, w = training_examples([tree], "children")
    assert [p.depth for p in prefixes] == [0, 1, 1] and targets[0] == pytest.approx(0.875) and list(w) == [2, 1, 4]
    with pytest.raises(ConfigError, match="target"):
        training_examples([tree], "nodes")


def test_recalibration_learns_a_depth_classes_bias_from_out_of_sample_records() -> None:
    # The inner model is fitted once and never moves (0 steps): prefixes succeed 10% of the time, it says 50%.
    inner = FeaturePredictor(dim=256, steps=0)
    cal = CalibratedPredictor(inner, ridge=0.1)
    rng = np.random.default_rng(0)
    prefixes = [Prefix(f"t{i}", "p", (("call", "out"),)) for i in range(400)]
    roots = [Prefix(f"t{i}", "p") for i in range(400)]
    for _ in range(3):
        targets = np.concatenate([(rng.random(400) < 0.1).astype(float), (rng.random(400) < 0.5).astype(float)])
        cal.fit(prefixes + roots, targets, np.ones(800))
    deep, top = cal.predict(prefixes[:1])[0], cal.predict(roots[:1])[0]
    assert deep == pytest.approx(0.1, abs=0.03) and top == pytest.approx(0.5, abs=0.05)
    again = CalibratedPredictor(FeaturePredictor(dim=256, steps=0))
    again.load_state_dict(cal.state_dict())
    np.testing.assert_allclose(again.predict(prefixes[:3] + roots[:3]), cal.predict(prefixes[:3] + roots[:3]))


@pytest.mark.parametrize("name", ["trace_root", "trace_refund", "trace_plus", "trace_root_uniform"])
def test_each_variant_spends_the_step_budget_exactly_on_the_simulation(name: str) -> None:
    tasks = make_tasks(96, seed=0)
    predictor, budget = FeaturePredictor(dim=512), StepBudget(16, 2)
    collector = SimCollector(tasks)
    for step in (1, 2, 3):
        result = take_step(collector, make_allocator(name, group_size=4, cap=4), predictor, tasks[:48], budget,
                           seed=0, step=step)
        m = result.metrics
        assert result.stats.trajectories == budget.total == m["alloc/budget"]
        assert m["alloc/prefix_flips"] <= m["alloc/prefix_anchors"]
        if name == "trace_root_uniform":  # uniform prefixes read no values: no expected flips
            assert m["alloc/prefix_anchors"] == 0 or np.isnan(m["alloc/prefix_flips_expected"])


def test_root_anchors_find_flips_where_the_decision_is_taken_at_the_first_turn() -> None:
    """A task decided at turn 1: every bare rollout's later prefixes are settled, only the root can flip."""
    tasks = [Task(f"t{i}", f"p{i}") for i in range(2)]
    trees = {t.id: two_turn_tree(t.id, [0.0, 0.0]) for t in tasks}
    roots = RootAllocation(tuple(t.id for t in tasks), np.array([0.5, 0.5]), {t.id: 2 for t in tasks})

    def values(prefixes):  # settled prefixes (they lost), uncertain roots
        return np.array([0.5 if p.depth == 0 else 0.001 for p in prefixes])

    plan, _ = make_variant("trace_root").plan(values, trees, roots, StepBudget(4, 2), np.random.default_rng(0))
    assert {c.task_id: c.continuations for c in plan.prefixes if c.node_id == 0} == {"t0": 4, "t1": 4}


def flipping_step(scale: FlipScale, n: int, flip_every: int, value: float = 0.5) -> ContinuationPlan:
    """``n`` two-turn trees, each with one bare rollout that succeeded and two continuations from its prefix, one
    anchor in ``flip_every`` flipping (its continuations failed); the scale expects and then observes them."""
    trees = {f"t{i}": two_turn_tree(f"t{i}", [1.0]) for i in range(n)}
    plan = ContinuationPlan(tuple(PrefixChoice(tid, 1, 1.0, value, 2) for tid in trees), {})
    scale.expect(plan, {tid: len(tree) for tid, tree in trees.items()})
    for i, tree in enumerate(trees.values()):
        for _ in range(2):
            tree.add(1, "answer", "", 0.0 if i % flip_every == 0 else 1.0, terminated=True)
    scale.observe(trees)
    return plan


def test_the_flip_scale_starts_at_one_and_moves_toward_realised_over_predicted() -> None:
    scale = FlipScale(prior=8.0)
    assert scale.scale().tolist() == [1.0, 1.0]
    flipping_step(scale, 8, flip_every=4)  # 2 of 8 flipped, 8 x 0.75 predicted: realised / predicted = 1/3
    s0, s1 = scale.scale()
    assert s0 == 1.0 and s1 == pytest.approx((2 + 8) / (6 + 8))  # no r = 0 anchor: that side keeps its prior
    for _ in range(7):
        flipping_step(scale, 64, flip_every=4)
    assert scale.scale()[1] == pytest.approx(flip_ratio(np.array(2 + 16 * 7), np.array(6 + 48 * 7), 8.0))
    assert abs(scale.scale()[1] - 1 / 3) < 0.03


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1e4), st.floats(1e-3, 1e4), st.floats(1e-3, 100.0))
def test_the_flip_ratio_lies_between_one_and_the_raw_ratio(realised, predicted, prior):
    s = float(flip_ratio(np.array(realised), np.array(predicted), prior))
    raw = realised / predicted
    assert min(1.0, raw) - 1e-12 <= s <= max(1.0, raw) + 1e-12


def test_the_flip_scale_keeps_its_window_and_round_trips_its_state() -> None:
    scale = FlipScale(prior=4.0, window=3)
    for every in (1, 2, 4, 8):
        flipping_step(scale, 16, flip_every=every)
    assert len(scale.records) == 3  # the first step's record has left the window
    again = FlipScale(prior=4.0, window=3)
    again.load_state_dict(scale.state_dict())
    assert again.scale().tolist() == scale.scale().tolist() and again.records == scale.records
    assert scale(np.array([0, 1]), np.array([1.0, 1.0])).tolist() == [1.0, scale.scale()[1]]  # roots unscaled


def test_a_scaled_down_prefix_gain_gives_its_continuations_to_the_root_anchor() -> None:
    """One prompt whose two bare rollouts failed, every value 0.5: the root and the prefixes share the first
    gains (0.5 each, then the root's 0.25). Once prefix flips come at 18/108 of their prediction (a prefix's first
    continuation is worth 0.083), the root also takes its third (0.125)."""
    trees = {"t": two_turn_tree("t", [0.0, 0.0])}
    roots = RootAllocation(("t",), np.array([0.5]), {"t": 2})
    budget, rng = StepBudget(2, 2), np.random.default_rng(0)
    plain, _ = make_variant("trace_root").plan(constant(0.5), trees, roots, budget, rng)
    scaled_variant = make_variant("trace_root", flip_scale_prior=8.0)
    assert scaled_variant.flip_scale is not None
    scaled_variant.flip_scale.records = [[10.0, 100.0, 10.0, 100.0]]
    scaled, _ = scaled_variant.plan(constant(0.5), trees, roots, budget, rng)
    at_root = {plan_name: sum(c.continuations for c in plan.prefixes if c.node_id == 0)
               for plan_name, plan in (("plain", plain), ("scaled", scaled))}
    assert (at_root["plain"], at_root["scaled"]) == (2, 3)
    assert sum(c.continuations for c in scaled.prefixes) == 4  # the prompt's budget, spent exactly


def test_a_flip_scale_needs_a_variant_with_active_prefixes() -> None:
    with pytest.raises(ConfigError, match="flip scale"):
        make_variant("trace_root_uniform", flip_scale_prior=8.0)
    with pytest.raises(ConfigError, match="flip scale"):
        make_allocator("trace", flip_scale_prior=8.0)


def test_a_variant_with_a_flip_scale_learns_it_on_the_simulation_and_checkpoints_it() -> None:
    tasks = make_tasks(96, seed=0)
    predictor, budget = FeaturePredictor(dim=512), StepBudget(16, 2)
    collector, allocator = SimCollector(tasks), make_allocator("trace_plus", group_size=4, cap=4, flip_scale_prior=8.0)
    assert make_allocator("trace_plus").state_dict() == {}  # without a scale, nothing to keep
    for step in (1, 2, 3):
        result = take_step(collector, allocator, predictor, tasks[:48], budget, seed=0, step=step)
        assert result.stats.trajectories == budget.total == result.metrics["alloc/budget"]
    m = result.metrics
    assert m["alloc/flip_scale_realised"] == m["alloc/prefix_flips"]
    assert m["alloc/flip_scale_predicted"] == pytest.approx(m["alloc/prefix_flips_expected"])
    again = make_allocator("trace_plus", group_size=4, cap=4, flip_scale_prior=8.0)
    again.load_state_dict(allocator.state_dict())
    assert isinstance(again, VariantAllocator) and again.flip_scale is not None
    assert again.flip_scale.scale().tolist() == allocator.flip_scale.scale().tolist() != [1.0, 1.0]
