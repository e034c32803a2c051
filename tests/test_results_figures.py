"""The registered experiment's figures in the README and docs/results.md are the committed headline's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADLINE = json.loads((ROOT / "docs" / "data" / "learning_tokens.json").read_text())["headline"]


def interval(figure: dict[str, float]) -> str:
    return f"{figure['mean']:+.3f} [{figure['lo']:+.3f}, {figure['hi']:+.3f}]"


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_the_primary_and_the_baseline_contrasts_are_quoted_from_the_headline(page):
    text = (ROOT / page).read_text()
    assert interval(HEADLINE["primary"]) in text
    for key in ("trace_plus_minus_treepo_at_budget", "trace_plus_minus_grpo_at_budget", "trace_minus_pcl_at_budget"):
        assert interval(HEADLINE["secondary"][key]) in text


def test_every_secondary_test_is_quoted_with_its_holm_p_in_the_results():
    text = (ROOT / "docs" / "results.md").read_text()
    for figure in HEADLINE["secondary"].values():
        assert interval(figure) in text
        p = figure["p_holm"]
        assert (f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}") in text


def test_the_verdict_follows_the_registered_rule():
    primary = HEADLINE["primary"]
    expected = "pass" if primary["lo"] > 0 else "fail" if primary["hi"] < 0.015 else "inconclusive"
    assert primary["verdict"] == expected and HEADLINE["complete"]
    assert HEADLINE["budget_tokens"] == 45_000 and HEADLINE["seeds"] == list(range(10))
    assert set(HEADLINE["rows"]) == {"trace_plus", "pcl", "treepo", "grpo", "trace"}
