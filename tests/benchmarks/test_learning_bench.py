"""The learning benchmark's bookkeeping on rows the trainer really writes: two rows and one seed of real (tiny,
untrained) runs on the chain task, then the tables and the headline built from them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning import gain_at_tokens, gain_curve, headline, paired_t, tabulate, train_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The seed's evaluation before training, then grpo and trace_plus for two steps of 16 trajectories."""
    from trace_gym.agents.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("learn")
    model = build_tiny_model(root / "nano", size="nano", seed=0)
    base = {"task": "chain", "model": str(model), "steps": 2, "eval_at": [1, 2], "eval_tasks": 4, "eval_samples": 1,
            "pool": 16, "tasks": 32, "roots": 8, "multiplier": 1, "mini_batches": 2, "threads": 1,
            "seed": 0, "run_root": str(root), "env_kwargs": {"max_turns": 3},
            "overrides": ["rollout.max_new_tokens=16"]}  # the untrained model's turns: short and few
    before = train_run({**base, "row": None})
    return before, [train_run({**base, "row": row}) for row in ("grpo", "trace_plus")]


def test_each_run_logs_its_steps_its_evaluations_and_equal_optimiser_steps(runs) -> None:
    before, trained = runs
    assert set(before["evals"]) == {0} and len(before["evals"][0]["success"]) == 4
    for run in trained:
        assert [r["step"] for r in run["rows"]] == [1, 2] and set(run["evals"]) == {1, 2}
        assert all(r["rollout/trajectories"] == 16 for r in run["rows"])
        assert all(r["loss/optimizer_steps"] in (0.0, 2.0) for r in run["rows"])  # 0: no node with an advantage
    plus = trained[1]["rows"]
    assert all("alloc/prefix_flips" in r and "alloc/refund" in r and "predictor/calibration_prefix_a" in r
               for r in plus)


def test_tables_and_headline_from_real_rows(runs) -> None:
    before, trained = runs
    befores = {0: before["evals"][0]}
    table = tabulate(trained, befores, ("grpo", "trace_plus"), mini_batches=2)
    rows = table["rows"]
    curve = gain_curve(trained[1], befores[0], "success")
    assert [p["step"] for p in curve] == [0, 1, 2] and curve[-1]["trajectories"] == 32
    expected = float(np.mean(np.subtract(trained[1]["evals"][2]["success"], befores[0]["success"])))
    assert rows["trace_plus"]["gain"]["success"]["mean"] == pytest.approx(expected)
    vs = rows["trace_plus"]["vs_grpo"]["success"]["mean"]
    assert vs == pytest.approx(expected - rows["grpo"]["gain"]["success"]["mean"])
    assert table["token_budget"][0] == min(rows[r]["tokens"]["mean"] for r in rows)
    head = headline(table, seeds=1)
    assert head["best_variant"] == "trace_plus" and head["seeds"] == 1
    assert head["trace_minus_grpo"]["mean"] == pytest.approx(vs)
    assert 0.0 <= head["prefix_flip_rate"] <= 1.0 or np.isnan(head["prefix_flip_rate"])


def test_interpolation_in_tokens_and_intervals_over_seeds() -> None:
    curve = [{"tokens": 0.0, "gain": 0.0}, {"tokens": 100.0, "gain": 0.1}, {"tokens": 300.0, "gain": 0.3}]
    assert gain_at_tokens(curve, 200.0) == pytest.approx(0.2) and gain_at_tokens(curve, 900.0) == pytest.approx(0.3)
    t = paired_t([0.1, 0.3])
    assert t["mean"] == pytest.approx(0.2) and t["lo"] < 0.2 < t["hi"] and t["n"] == 2
    assert t["hi"] - t["mean"] == pytest.approx(12.706 * np.std([0.1, 0.3], ddof=1) / np.sqrt(2))
