import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.training.config import ADVANTAGE_METHODS
from trace_gym.training.update.advantages import (
    grpo_advantages,
    node_advantages,
    tree_advantages,
    tree_grpo_advantages,
    tree_value_advantages,
)
from trace_gym.tree import RolloutTree
from trace_gym.tree_stats import bottom_up_values

# root -> a, b; a -> c (1), d (0); b leaf (1).  Leaf rewards (1, 0, 1): mean 2/3, std sqrt(2)/3.
PARENTS = np.array([-1, 0, 0, 1, 1])
REWARDS = np.array([0.0, 0.0, 1.0, 1.0, 0.0])
LEAF = np.array([False, False, True, True, True])


@st.composite
def trees(draw):
    n = draw(st.integers(2, 20))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    has_child = set(parents[1:])
    leaf = np.array([i not in has_child for i in range(n)])
    rewards = np.array([float(draw(st.booleans())) for _ in range(n)])
    return np.array(parents), rewards, leaf


def test_grpo_hand_values():
    std = np.sqrt(2) / 3
    adv = grpo_advantages(PARENTS, REWARDS, LEAF, eps=0.0)
    assert np.isnan(adv[0])
    assert adv[1:].tolist() == pytest.approx([(0.5 - 2 / 3) / std, (1 - 2 / 3) / std, (1 - 2 / 3) / std,
                                               (0 - 2 / 3) / std])


def test_grpo_on_flat_group_is_plain_grpo():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    parents = np.array([-1, 0, 0, 0, 0, 0])
    adv = grpo_advantages(parents, np.r_[0.0, r], np.r_[False, np.ones(5, bool)])
    assert adv[1:] == pytest.approx((r - r.mean()) / (r.std() + 1e-6))


def test_tree_grpo_hand_values():
    std = np.sqrt(2) / 3
    adv = tree_grpo_advantages(PARENTS, REWARDS, LEAF, eps=0.0)
    # Sibling groups: (a: 0.5, b: 1) -> -1, +1; (c: 1, d: 0) -> +1, -1.
    glob = np.array([0.5 - 2 / 3, 1 / 3, 1 / 3, -2 / 3]) / std
    assert adv[1:].tolist() == pytest.approx((glob + np.array([-1, 1, 1, -1])).tolist())


def test_tree_value_hand_values():
    adv = tree_value_advantages(PARENTS, REWARDS, LEAF)
    # a: ((0.5 - 2/3) + (0.5 - 2/3)) / sqrt(2); c: ((1 - 0.5) + (1 - 2/3)) / 1
    assert adv[1] == pytest.approx(2 * (0.5 - 2 / 3) / np.sqrt(2))
    assert adv[2] == pytest.approx(2 * (1 - 2 / 3))
    assert adv[3] == pytest.approx(0.5 + 1 / 3)
    assert adv[4] == pytest.approx(-0.5 - 2 / 3)


@pytest.mark.parametrize("method", ADVANTAGE_METHODS)
@settings(max_examples=40, deadline=None)
@given(tree=trees(), reward=st.sampled_from([0.0, 1.0]))
def test_equal_rewards_give_zero_advantages(method, tree, reward):
    parents, _, leaf = tree
    adv = node_advantages(parents, np.full(len(parents), reward), leaf, method)
    assert np.allclose(adv[1:], 0.0)


@pytest.mark.parametrize("method", ADVANTAGE_METHODS)
@settings(max_examples=40, deadline=None)
@given(tree=trees())
def test_sibling_leaves_ordered_by_reward(method, tree):
    parents, rewards, leaf = tree
    adv = node_advantages(parents, rewards, leaf, method)
    for p in set(parents[1:].tolist()):
        kids = [c for c in range(len(parents)) if parents[c] == p and leaf[c]]
        for a in kids:
            for b in kids:
                if rewards[a] > rewards[b]:
                    assert adv[a] > adv[b]


@settings(max_examples=40, deadline=None)
@given(tree=trees())
def test_grpo_leaf_weighted_sum_over_root_children_is_zero(tree):
    parents, rewards, leaf = tree
    _, counts = bottom_up_values(parents, rewards, leaf)
    adv = grpo_advantages(parents, rewards, leaf)
    kids = np.flatnonzero(parents == 0)
    assert float(np.sum(counts[kids] * adv[kids])) == pytest.approx(0.0, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(tree=trees())
def test_tree_value_local_terms_cancel_per_branch_point(tree):
    parents, rewards, leaf = tree
    values, counts = bottom_up_values(parents, rewards, leaf)
    adv = tree_value_advantages(parents, rewards, leaf)
    # sqrt(n)·A - (V(y) - V(root)) is the local term V(y) - V(p); its leaf-weighted sum per parent is 0.
    local = np.sqrt(counts) * adv - (values - values[0])
    for p in set(parents[1:].tolist()):
        kids = np.flatnonzero(parents == p)
        assert float(np.sum(counts[kids] * local[kids])) == pytest.approx(0.0, abs=1e-9)


def test_unfinished_nodes_are_not_trained():
    # root -> a (unfinished, no leaf yet), b (leaf, 1)
    adv = grpo_advantages(np.array([-1, 0, 0]), np.array([0.0, 0.0, 1.0]), np.array([False, False, True]))
    assert np.isnan(adv[0]) and np.isnan(adv[1]) and np.isfinite(adv[2])


def test_tree_advantages_maps_rolloutree_node_ids():
    tree = RolloutTree("t", "prompt")
    a = tree.add(0, "a", "o")
    tree.add(0, "b", "o", reward=1.0, terminated=True)
    tree.add(a.id, "c", "o", reward=1.0, terminated=True)
    tree.add(a.id, "d", "o", reward=0.0, truncated=True)
    adv = tree_advantages(tree, "grpo")
    assert sorted(adv) == [1, 2, 3, 4]
    assert adv == pytest.approx(dict(enumerate(grpo_advantages(PARENTS, REWARDS, LEAF)[1:], start=1)))
