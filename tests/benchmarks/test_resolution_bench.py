"""The simulation's stage-2 comparison with the oracle (benchmarks/allocation_sim.py, `resolution_run`) on tiny
settings: no plan expects more flips under the exact values than the plan the exact values choose."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from allocation_sim import RESOLUTION_PLANS, RESOLUTION_SETTINGS, resolution_run, summarise_resolution

CFG = {"tasks": 96, "pool": 32, "roots": 8, "multiplier": 3, "horizon": 4, "steps": 4}


def test_no_plan_expects_more_flips_than_the_oracles_on_the_same_bare_rollouts() -> None:
    runs = [resolution_run(seed, CFG) for seed in (0, 1)]
    for rows in runs:
        for row in rows:
            for name in RESOLUTION_SETTINGS:
                for plan in RESOLUTION_PLANS:
                    assert row[f"{name}/{plan}/expected_true"] <= row[f"oracle/{plan}"] + 1e-9
    summary = summarise_resolution(runs)
    assert set(summary) == {f"{n}/{p}" for n in RESOLUTION_SETTINGS for p in RESOLUTION_PLANS}
    assert all(0 < s["fraction_of_oracle"]["mean"] <= 1 + 1e-9 for s in summary.values())

