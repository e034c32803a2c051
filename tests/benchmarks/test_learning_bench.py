"""The learning benchmark's bookkeeping: the eval curve against budget spent, and seeds aggregated into
intervals (the training runs themselves are `make bench-ci`'s, which CI runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning import aggregate, curve, mixed_ratio, versus


def run(seed: int, gain: float, ratio: float, prompts: float = 40.0) -> dict:
    """A run as `train_run` returns it: the trainer's summary and its metrics rows (eval at steps 0 and 2)."""
    step = {"rollout/trajectories": 256.0, "rollout/tokens": 1000.0 + seed, "rollout/prompts": prompts,
            "alloc/effective_ratio": ratio, "alloc/pairs_per_1k_tokens": 10.0 * ratio}
    rows = [{"step": 0, "eval/success": 0.5, "eval/expert_prob": 0.4},
            {"step": 1, **step},
            {"step": 2, **step, "eval/success": 0.5 + gain, "eval/expert_prob": 0.4 + gain / 2}]
    summary = {"success_before": 0.5, "success_after": 0.5 + gain, "trajectories": 512, "generated_tokens": 2000,
               "wall_s": 10.0, "gain": {"success": {"mean": gain, "lo": gain - 0.1, "hi": gain + 0.1, "tasks": 8},
                                        "expert": {"mean": gain / 2, "lo": 0.0, "hi": gain, "tasks": 8}}}
    return {"seed": seed, "summary": summary, "rows": rows}


def test_curve_counts_the_budget_spent_before_each_evaluation() -> None:
    points = curve(run(0, 0.1, 0.5))
    assert [p["trajectories"] for p in points] == [0.0, 512.0]
    assert [p["tokens"] for p in points] == [0.0, 2000.0]
    assert points[1]["success"] == pytest.approx(0.6) and points[1]["expert"] == pytest.approx(0.45)


def test_aggregate_takes_means_and_intervals_over_seeds() -> None:
    out = aggregate([run(0, 0.1, 0.5), run(1, 0.3, 0.25)])
    assert out["seeds"] == 2
    assert out["gain_success"]["mean"] == pytest.approx(0.2) and out["gain_success"]["n"] == 2
    assert out["gain_success"]["ci95"] > 0  # two different gains: a t-interval with 1 degree of freedom
    assert out["gain_expert"]["mean"] == pytest.approx(0.1)
    assert out["effective_ratio"]["mean"] == pytest.approx(0.375)
    assert out["mixed_per_step"]["mean"] == pytest.approx(0.375 * 40)  # ratio x prompts, per step
    assert out["pairs_per_1k_tokens"]["mean"] == pytest.approx(3.75)
    assert [p["trajectories"]["mean"] for p in out["curve"]] == [0.0, 512.0]
    assert [g["success"]["tasks"] for g in out["gain_per_seed"]] == [8, 8]


def test_versus_subtracts_the_baseline_seed_by_seed() -> None:
    ours = [{**run(0, 0.3, 0.5), "seed": 0}, {**run(1, 0.1, 0.5), "seed": 1}]
    base = [{**run(1, 0.05, 0.5), "seed": 1}, {**run(0, 0.2, 0.5), "seed": 0}]  # order must not matter
    out = versus(ours, base)
    assert out["success"]["mean"] == pytest.approx(((0.3 - 0.2) + (0.1 - 0.05)) / 2)
    assert out["expert"]["mean"] == pytest.approx(((0.15 - 0.1) + (0.05 - 0.025)) / 2) and out["expert"]["n"] == 2


def test_mixed_ratio_divides_mixed_prompts_per_step_seed_by_seed() -> None:
    ours = [run(0, 0.0, 0.5, prompts=60.0), run(1, 0.0, 0.5, prompts=40.0)]
    base = [run(1, 0.0, 0.25, prompts=40.0), run(0, 0.0, 0.25, prompts=40.0)]
    out = mixed_ratio(ours, base)
    assert out["mean"] == pytest.approx((30 / 10 + 20 / 10) / 2) and out["n"] == 2
