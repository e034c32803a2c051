"""The figures of docs/results.md's "A predictor with resolution" are the committed data's
(docs/data/predictor_resolution.json, written by benchmarks/predictor_resolution.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "docs" / "data" / "predictor_resolution.json").read_text())
TEXT = (ROOT / "docs" / "results.md").read_text()


@pytest.mark.parametrize("plan", ["trace", "trace_root", "trace_plus"])
def test_the_flip_counts_and_ratios_at_the_warm_start_are_the_datas(plan):
    for setting in ("default", "resolution"):
        g = DATA["flips"]["chain"][setting][plan]
        assert f"{g['flipped']} / {g['expected']:.0f} ({g['ratio']:.2f})" in TEXT
        assert f"{g['flipped']} / {g['expected_scaled']:.0f} ({g['ratio_scaled']:.2f}" in TEXT
        assert f"{g['ratio_scaled_after_step_1']:.2f}" in TEXT


@pytest.mark.parametrize("plan", ["trace", "trace_root"])
def test_the_simulations_shares_of_the_oracle_are_the_datas(plan):
    rows = DATA["simulation"]["rows"]
    settings = ("default", "scale", "logprobs", "resolution")
    cells = [rows[f"{setting}/{plan}"]["fraction_of_oracle"] for setting in settings]
    assert f"| {plan} | " + " | ".join(f"{c['mean']:.3f} ± {c['ci95']:.3f}" for c in cells) + " |" in TEXT
