"""Tree statistics (trace_gym/tree_stats.py): bottom-up values, mixed outcomes, sibling groups and contrastive
pairs, against values computed by hand and against their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.tree import RolloutTree
from trace_gym.tree_stats import bottom_up_values, contrastive_pairs, is_mixed, sibling_groups, tree_arrays, tree_values


def test_bottom_up_values_hand_tree():
    # root -> a, b; a -> c (1), d (0); b leaf (1).  V(a) = 1/2, V(root) = 2/3.
    parents = np.array([-1, 0, 0, 1, 1])
    rewards = np.array([0.0, 0.0, 1.0, 1.0, 0.0])
    leaf = np.array([False, False, True, True, True])
    values, counts = bottom_up_values(parents, rewards, leaf)
    assert values.tolist() == pytest.approx([2 / 3, 0.5, 1.0, 1.0, 0.0])
    assert counts.tolist() == [3, 2, 1, 1, 1]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_bottom_up_values_is_weighted_mean_of_children(data):
    n = data.draw(st.integers(2, 25))
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n)]
    has_child = set(parents[1:])
    leaf = np.array([i not in has_child for i in range(n)])
    rewards = np.array([float(data.draw(st.booleans())) for _ in range(n)])
    values, counts = bottom_up_values(np.array(parents), rewards, leaf)
    for y in range(n):
        kids = [c for c in range(n) if parents[c] == y]
        if kids:
            assert counts[y] == sum(counts[c] for c in kids)
            assert values[y] == pytest.approx(sum(counts[c] * values[c] for c in kids) / counts[y])


def test_contrastive_pairs_hand_count():
    # root -> nodes 1 (V = 0.5), 2 (0), 3 (0): (1,2) and (1,3) differ; node 1 -> leaves 4 (1), 5 (0): 1 pair
    parents = np.array([-1, 0, 0, 0, 1, 1])
    values = np.array([0.0, 0.5, 0.0, 0.0, 1.0, 0.0])
    counts = np.array([4, 2, 1, 1, 1, 1])
    assert contrastive_pairs(parents, values, counts) == 3


def test_sibling_groups_are_the_children_of_each_branch_point_with_a_finished_leaf():
    # root -> 1, 2, 3; 1 -> 4, 5; node 3 has no finished leaf (count 0)
    parents = np.array([-1, 0, 0, 0, 1, 1])
    counts = np.array([3, 2, 1, 0, 1, 1])
    assert sorted(map(sorted, sibling_groups(parents, counts))) == [[1, 2], [4, 5]]


def test_is_mixed_needs_a_success_and_a_failure_among_the_leaves():
    leaf = np.array([False, True, True])
    assert is_mixed(np.array([0.0, 1.0, 0.0]), leaf)
    assert not is_mixed(np.array([0.0, 1.0, 1.0]), leaf)
    assert not is_mixed(np.array([1.0, 0.0, 1.0]), np.array([True, False, True]))  # the failure is no leaf


def test_tree_values_of_a_rollout_tree_match_its_arrays():
    tree = RolloutTree("t", "prompt")
    a = tree.add(0, "a", "o", 0.0, False, False)
    tree.add(a.id, "c", "o", 1.0, True, False)
    tree.add(a.id, "d", "o", 0.0, True, False)
    tree.add(0, "b", "o", 1.0, True, False)
    arrays = tree_arrays(tree)
    values, counts = tree_values(tree)
    want_values, want_counts = bottom_up_values(arrays.parents, arrays.rewards, arrays.is_leaf)
    assert values.tolist() == pytest.approx(want_values.tolist()) and counts.tolist() == want_counts.tolist()
    assert values[0] == pytest.approx(2 / 3) and tree.value() == pytest.approx(2 / 3)
