"""The flip measurement's bookkeeping: which continuations belong to which anchor and plan, and the shares."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from trace_gym.training.allocation.stages import ContinuationPlan, PrefixChoice
from trace_gym.tree import RolloutTree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from flips import anchor_records, continuation_flip_share, flip_share, grouped, realised_over_predicted


def bare_tree() -> RolloutTree:
    """Two bare rollouts of two turns: 0 -> 1 -> 2 (reward 1), 0 -> 3 -> 4 (reward 0)."""
    tree = RolloutTree("t", "prompt")
    tree.add(0, "call", "a=1")
    tree.add(1, "answer", "", reward=1.0, terminated=True)
    tree.add(0, "call", "a=1")
    tree.add(3, "answer", "", reward=0.0, terminated=True)
    return tree


def test_an_anchor_is_scored_on_its_own_plans_continuations_only() -> None:
    tree = bare_tree()
    first = len(tree)
    tree.add(1, "answer", "", reward=0.0, terminated=True)  # plan A: from node 1, the other outcome
    tree.add(3, "answer", "", reward=0.0, terminated=True)  # plan A: from node 3, the same outcome
    plan = ContinuationPlan((PrefixChoice("t", 1, 1.0, 0.6, 1), PrefixChoice("t", 3, 0.0, 0.5, 1),
                             PrefixChoice("t", 0, 1.0, 0.5, 0)), {})
    records = anchor_records({"t": tree}, plan, {"t": first}, {"t": "guess"}, "active")
    assert [(r["depth"], r["flipped"], r["outcomes"]) for r in records] == [(1, True, [0.0]), (1, False, [0.0])]
    assert records[0]["expected"] == pytest.approx(1 - 0.6)  # q = r v + (1 - r)(1 - v) = 0.6, k = 1
    later = len(tree)
    tree.add(1, "answer", "", reward=1.0, terminated=True)  # plan B: from node 1, the same outcome
    plan_b = ContinuationPlan((PrefixChoice("t", 1, 1.0, None, 1),), {})
    (b,) = anchor_records({"t": tree}, plan_b, {"t": later}, {}, "uniform")
    assert not b["flipped"] and b["outcomes"] == [1.0]  # plan A's flip at node 1 is not plan B's


def test_shares_count_anchors_and_continuations() -> None:
    rows = [{"flipped": True, "r": 1.0, "outcomes": [0.0, 1.0], "k": 2, "depth": 1, "expected": 0.5},
            {"flipped": False, "r": 0.0, "outcomes": [0.0], "k": 1, "depth": 2, "expected": 0.1}]
    assert flip_share(rows) == 0.5 and continuation_flip_share(rows) == pytest.approx(1 / 3)
    by = grouped(rows, "depth")
    assert by["1"]["flipped"] == 1 and by["2"]["continuations"] == 1 and by["2"]["expected"] == pytest.approx(0.1)


def test_realised_over_predicted_reads_the_predictors_or_the_scales_expectation() -> None:
    rows = [{"flipped": True, "expected": 0.8, "scaled": 0.4}, {"flipped": False, "expected": 1.2, "scaled": 0.6},
            {"flipped": True, "expected": 0.5}]  # a plan measured without a scale
    assert realised_over_predicted(rows) == pytest.approx(2 / 2.5)
    assert realised_over_predicted(rows, "scaled") == pytest.approx(2 / 1.0)
    assert np.isnan(realised_over_predicted([{"flipped": True, "expected": float("nan")}]))
