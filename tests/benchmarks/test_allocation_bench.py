"""The simulation benchmark's quick path on tiny settings: its JSON shape and the oracle >= trace >= grpo order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_gym.training.config import ALLOCATORS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "allocation.py"
pytestmark = pytest.mark.slow  # ~12 s of CPU, more on a shared machine

STATS = ("effective_ratio", "effective_ratio_sample", "mixed_prompts", "pairs_per_trajectory",
         "pairs_per_1k_tokens", "tokens", "trajectories", "brier_true")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    # 16 steps: the predictor (lr 0.01) needs ~10 fits to warm up, and the figures average the second half.
    subprocess.run([sys.executable, str(SCRIPT), "--quick", "--seeds", "3", "--steps", "16", "--tasks", "256",
                    "--pool", "64", "--workers", "1", "--no-diagnostics", "--results-dir", str(out), "--out", "t"],
                   check=True, capture_output=True, text=True, timeout=600)
    assert (out / "t_sim.png").stat().st_size > 0
    return json.loads((out / "t.json").read_text())


def test_every_allocator_reports_every_statistic_with_an_interval(result: dict) -> None:
    rows = result["simulation"]["allocators"]
    assert set(rows) == set(ALLOCATORS)
    for name in ALLOCATORS:
        for stat in STATS:
            assert rows[name][stat]["n"] == 3, (name, stat)
            assert rows[name][stat]["ci95"] is not None and rows[name][stat]["ci95"] >= 0, (name, stat)
        assert len(rows[name]["curve"]) == 16


def test_every_allocator_spends_the_same_trajectory_budget(result: dict) -> None:
    budget = result["simulation"]["settings"]["budget_per_step"]
    for name, row in result["simulation"]["allocators"].items():
        assert row["trajectories"]["mean"] == budget, name


def test_oracle_beats_trace_beats_grpo_on_effective_ratio(result: dict) -> None:
    rows = result["simulation"]["allocators"]
    eff = {name: rows[name]["effective_ratio"]["mean"] for name in ("oracle", "trace", "grpo")}
    assert eff["oracle"] >= eff["trace"] >= eff["grpo"], eff


def test_exact_roots_estimate_follows_the_difficulty_spread() -> None:
    """Certain prompts give the root stage nothing to find. On coin flips 32 roots yield 8 mixed prompts in
    expectation however they are split (pairs: 16 x 0.5; triples: 10 x 0.75 + 0.5), each mixed with
    probability 0.5 to 0.75."""
    sys.path.insert(0, str(SCRIPT.parent))
    from allocation_real import exact_roots_effective

    certain = exact_roots_effective(np.array([0.0, 1.0] * 40), pool=64, roots=32, cap=8, draws=5)
    assert certain["ratio"] == 0.0 and certain["mixed_prompts"] == 0.0
    coin = exact_roots_effective(np.full(80, 0.5), pool=64, roots=32, cap=8, draws=5)
    assert coin["mixed_prompts"] == pytest.approx(8.0) and 0.5 <= coin["ratio"] <= 0.75
