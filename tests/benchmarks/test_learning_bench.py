"""The learning benchmark: real (tiny, untrained) runs that write their files, skip when done and resume after an
interruption; and the registered analysis (gain at the token budget, verdict, Holm) on runs with known values."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning import (
    BUDGET,
    REGISTERED_ROWS,
    analyse,
    gain_at,
    gain_curve,
    holm,
    t_test,
    tokens_to,
    train_run,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("learn")
    model = build_tiny_model(root / "nano", size="nano", seed=0)
    base = {"model": str(model), "steps": 2, "eval_at": [2], "eval_tasks": 4, "eval_samples": 1, "pool": 16,
            "tasks": 32, "roots": 8, "multiplier": 1, "mini_batches": 2, "lr": 2e-5, "mini_batch": 32, "threads": 1,
            "seed": 0, "data": str(root / "data"), "work": str(root / "work"), "code_commit": "test",
            "env_kwargs": {"max_turns": 3}, "overrides": ["rollout.max_new_tokens=16"]}
    return root, base


def test_a_run_writes_its_file_counts_its_costs_and_is_not_run_twice(tiny) -> None:
    root, base = tiny
    before = train_run({**base, "row": None})
    assert set(before["evals"]) == {"0"} and len(before["evals"]["0"]["success"]) == 4
    run = train_run({**base, "row": "trace_plus"})
    assert [r["step"] for r in run["rows"]] == [1, 2]
    assert set(run["evals"]) == {"1", "2"} and set(run["evals"]["1"]) == {"expert"}  # the expert alone at 1
    assert set(run["evals"]["2"]) >= {"success", "expert"}
    assert all(r["rollout/trajectories"] == 16 for r in run["rows"])
    assert run["rows"][-1]["prefill_tokens"] > 0 and run["rows"][-1]["decode_tokens"] > 0
    assert run["rows"][1]["train_cpu_s"] > run["rows"][0]["train_cpu_s"] > 0
    path = root / "data" / "runs" / "trace_plus-s0.json"
    assert json.loads(path.read_text())["rows"] == run["rows"]
    again = train_run({**base, "row": "trace_plus"})
    assert again.get("skipped") and again["rows"] == run["rows"]


def test_an_interrupted_run_resumes_from_its_last_step(tiny) -> None:
    root, base = tiny
    first = train_run({**base, "row": "pcl", "steps": 1, "eval_at": []})
    assert [r["step"] for r in first["rows"]] == [1]
    (root / "data" / "runs" / "pcl-s0.json").unlink()  # as if stopped after step 1's checkpoint
    resumed = train_run({**base, "row": "pcl"})
    assert [r["step"] for r in resumed["rows"]] == [1, 2] and resumed["resumed_at"] == [1]
    assert resumed["rows"][0] == first["rows"][0]
    assert resumed["rows"][1]["decode_tokens"] > first["rows"][0]["decode_tokens"]


# ------------------------------------------------------------------------------- the registered analysis
def _run(row: str, seed: int, tokens_per_step: float, gains: dict[int, float]) -> dict:
    """A run file's shape with 12 steps of ``tokens_per_step`` and success ``0.5 + gain`` on 2 prompts."""
    rows = [{"step": s, "rollout/tokens": tokens_per_step, "train_wall_s": 2.0 * s, "train_cpu_s": 1.5 * s,
             "prefill_tokens": 10.0 * s, "loss/forward_tokens": 7.0, "alloc/effective_ratio": 0.5}
            for s in range(1, 13)]
    evals = {str(s): {"success": [0.5 + g, 0.5 + g], "expert": [0.2, 0.2]} for s, g in gains.items()}
    return {"row": row, "seed": seed, "rows": rows, "evals": evals}


BEFORE = {"success": [0.5, 0.5], "expert": [0.2, 0.2]}


def test_the_gain_at_the_budget_is_linear_between_the_bracketing_evaluations() -> None:
    run = _run("pcl", 0, 6000.0, {4: 0.04, 6: 0.08, 8: 0.12})
    curve = gain_curve(run, BEFORE, "success")
    assert [(p["step"], p["tokens"]) for p in curve] == [(0, 0.0), (4, 24000.0), (6, 36000.0), (8, 48000.0)]
    gain, reached = gain_at(curve, 45000.0)  # between 36k (0.08) and 48k (0.12): three quarters of the way
    assert reached and gain == pytest.approx(0.11)
    short = gain_at(curve, 60000.0)
    assert short == (pytest.approx(0.12), False)
    assert tokens_to(curve, 0.10) == pytest.approx(42000.0) and math.isnan(tokens_to(curve, 0.5))


def test_t_test_and_holm_match_hand_values() -> None:
    t = t_test([1.0, 2.0, 3.0, 4.0])  # mean 2.5, sd 1.29099, se 0.645497, t 3.87298 on 3 df
    assert t["mean"] == 2.5 and t["n"] == 4
    assert t["hi"] - t["mean"] == pytest.approx(3.182446 * 0.645497, rel=1e-3)
    assert t["p"] == pytest.approx(0.030466, rel=1e-3)
    h = holm({"a": 0.01, "b": 0.04, "c": 0.03})  # sorted 0.01, 0.03, 0.04 -> 0.03, 0.06, max(0.06, 0.04)
    assert h["a"]["p_holm"] == pytest.approx(0.03) and h["a"]["rejected"]
    assert h["c"]["p_holm"] == pytest.approx(0.06) and not h["c"]["rejected"]
    assert h["b"]["p_holm"] == pytest.approx(0.06) and not h["b"]["rejected"]


@pytest.mark.parametrize(("lead", "spread", "verdict"),
                         [(0.03, 0.01, "pass"), (-0.03, 0.01, "fail"), (0.01, 0.03, "inconclusive")])
def test_the_verdict_follows_the_registered_rule(lead: float, spread: float, verdict: str) -> None:
    rng = np.random.default_rng(0)
    runs, befores = [], {}
    for seed in range(10):
        befores[seed] = BEFORE
        noise = float(rng.normal(0, spread))
        for row in REGISTERED_ROWS:
            extra = lead + noise if row == "trace_plus" else 0.0
            tokens = 4000.0 if row == "trace" else 6000.0
            runs.append(_run(row, seed, tokens, {s: 0.01 * s + extra for s in (4, 6, 8, 10, 12)}))
    table = analyse(runs, befores)
    assert table["complete"] and table["primary"]["n"] == 10
    assert table["primary"]["verdict"] == verdict
    assert set(table["secondary"]) == {"trace_plus_minus_treepo_at_budget", "trace_plus_minus_grpo_at_budget",
                                       "trace_minus_pcl_at_budget", "log_tokens_to_target_trace_plus_over_pcl",
                                       "trace_plus_minus_pcl_at_step8"}
    assert all(v["p_holm"] >= v["p"] for v in table["secondary"].values() if np.isfinite(v["p"]))
    pcl = table["rows"]["pcl"]
    assert pcl["short_of_budget"] == [] and pcl["at_budget"]["train_cpu_s"]["mean"] == pytest.approx(
        1.5 * BUDGET / 6000.0)
    assert table["rows"]["trace"]["at_budget"]["loss/forward_tokens"]["mean"] == pytest.approx(7.0 * BUDGET / 4000)


def test_missing_seeds_make_the_verdict_incomplete() -> None:
    runs = [_run(r, s, 5000.0, {4: 0.02, 12: 0.1}) for s in range(3) for r in ("trace_plus", "pcl")]
    table = analyse(runs, {s: BEFORE for s in range(3)}, rows=("trace_plus", "pcl"))
    assert not table["complete"] and table["primary"]["verdict"].startswith("incomplete")
