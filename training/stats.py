"""Intervals for reported figures: the Wilson score interval of a success rate, the t-interval of a mean over
independent draws and the paired difference of two evaluations of the same prompts.

A success rate gets Wilson's interval, not mean +- t * sd / sqrt(n): at 0 or 1 every draw is the same, the
sample deviation is 0, and the t-interval shrinks to the point ([1.000, 1.000] after 5 of 5 as after 50 of 50),
while Wilson's stays inside [0, 1] and widens as n falls (5 of 5: [0.566, 1]; 50 of 50: [0.929, 1]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_ci95(values: Sequence[float | None]) -> tuple[float, float, int]:
    """(mean, half-width of the 95% t-interval, n) over the finite values, taken as independent draws; the
    half-width is NaN below two values and the mean NaN without any."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(x) < 2:
        return (float(x[0]) if len(x) else float("nan")), float("nan"), len(x)
    t = _T95[len(x) - 2] if len(x) - 1 <= len(_T95) else 1.96
    return float(x.mean()), float(t * x.std(ddof=1) / np.sqrt(len(x))), len(x)


Z95 = 1.959964
"""The normal quantile of a two-sided 95% interval."""


def wilson_interval(rate: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a rate measured on ``n`` independent draws, each scoring in
    [0, 1]: exact coverage theory for 0/1 draws; for draws that are themselves means of 0/1 samples (a prompt's
    success over several samples) the binomial variance is an upper bound on theirs, so the interval errs wide.
    NaN bounds without draws."""
    if n < 1 or not np.isfinite(rate):
        return float("nan"), float("nan")
    p = min(max(float(rate), 0.0), 1.0)
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


@dataclass(frozen=True)
class PairedDifference:
    """after - before over the same prompts: mean gain, its 95% interval from per-prompt differences, n prompts."""

    mean: float
    lo: float
    hi: float
    tasks: int

    @classmethod
    def of(cls, diffs: Sequence[float]) -> PairedDifference:
        """Summarise per-prompt differences (any per-prompt measure, one value per prompt)."""
        mean, half, n = mean_ci95(list(diffs))
        return cls(mean, mean - half, mean + half, n)

    def __str__(self) -> str:
        return f"{self.mean:+.4f} [{self.lo:+.4f}, {self.hi:+.4f}]"
