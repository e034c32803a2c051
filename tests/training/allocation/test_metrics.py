import numpy as np
import pytest

from trace_gym.training.allocation.metrics import (
    brier,
    calibration_metrics,
    nonzero_fraction,
    rank_correlation,
    reliability_bins,
    tree_metrics,
)
from trace_gym.tree import RolloutTree


def test_nonzero_fraction_counts_trained_nodes_only():
    adv = np.array([np.nan, 0.0, 1.0, -2.0, np.nan])
    assert nonzero_fraction(adv) == pytest.approx(2 / 3)
    assert nonzero_fraction(adv, tokens=np.array([5, 10, 1, 1, 7])) == pytest.approx(2 / 12)


def test_brier_hand_value():
    assert brier(np.array([0.2, 0.9]), np.array([0.0, 1.0]), np.array([1.0, 3.0])) == pytest.approx(
        (0.04 + 3 * 0.01) / 4)


def test_rank_correlation_hand_values():
    assert rank_correlation(np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.5, 1.0])) == pytest.approx(1.0)
    assert rank_correlation(np.array([0.3, 0.2, 0.1]), np.array([0.0, 0.5, 1.0])) == pytest.approx(-1.0)
    # ties take their average rank: ranks (1.5, 1.5, 3) against (1, 2, 3) -> Pearson sqrt(3) / 2
    assert rank_correlation(np.array([0.5, 0.5, 0.9]), np.array([0.0, 0.2, 1.0])) == pytest.approx(np.sqrt(3) / 2)
    assert np.isnan(rank_correlation(np.array([0.5, 0.5, 0.5]), np.array([0.0, 0.5, 1.0])))  # no ranking
    assert np.isnan(rank_correlation(np.array([0.1, 0.2]), np.array([0.0, 1.0])))


def test_reliability_bins_hand_values():
    bins = reliability_bins(np.array([0.05, 0.15, 0.95, 1.0]), np.array([0.0, 1.0, 1.0, 0.0]), n_bins=2)
    assert bins[0]["weight"] == 2 and bins[0]["pred"] == pytest.approx(0.1) and bins[0]["target"] == 0.5
    assert bins[1]["weight"] == 2 and bins[1]["pred"] == pytest.approx(0.975) and bins[1]["target"] == 0.5


def test_calibration_of_perfect_predictions_is_zero():
    p = np.array([0.1, 0.5, 0.9])
    m = calibration_metrics(p, p, np.ones(3))
    assert m["predictor/brier"] == 0.0 and m["predictor/ece"] == 0.0


def test_tree_metrics_hand_trees():
    mixed = RolloutTree("a", "p")
    n1 = mixed.add(0, "s", "o")
    mixed.nodes[n1.id].token_ids = [1, 2, 3]
    mixed.add(n1.id, "x", "o", reward=1.0, terminated=True)
    mixed.add(n1.id, "y", "o", reward=0.0, terminated=True)
    flat = RolloutTree("b", "p")
    flat.add(0, "z", "o", reward=0.0, terminated=True)
    flat.add(0, "z", "o", reward=0.0, truncated=True)
    # trained nodes: n1 (A = 0), two leaves (±1), two flat leaves (0) -> 2 of 5 non-zero; the root is untrained
    m = tree_metrics([mixed, flat], [{n1.id: 0.0, 2: 1.0, 3: -1.0}, {1: 0.0, 2: 0.0}])
    assert m["alloc/effective_ratio"] == 0.5
    assert m["alloc/pairs"] == 1 and m["alloc/pairs_per_trajectory"] == 0.25
    assert m["rollout/success"] == 0.25 and m["rollout/trajectories"] == 4
    assert m["alloc/effective_ratio_sample"] == pytest.approx(2 / 5)
    assert m["alloc/effective_ratio_token"] == 0.0  # n1's 3 tokens are the only ones, and its advantage is 0
    assert m["alloc/pairs_per_1k_tokens"] == pytest.approx(1000 / 3)
