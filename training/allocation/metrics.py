"""Step metrics: effective ratio, contrastive sibling pairs, predictor calibration (Brier, reliability).

Deviations and choices where the paper is silent:
1. A contrastive sibling pair is an unordered pair of children of one branch point whose bottom-up values
   V̂ differ (for two leaves: opposite outcomes); siblings without a finished leaf are skipped.
2. Per-sample effective ratio = fraction of trained nodes (or of their tokens, when token counts are given)
   whose advantage is non-zero (|A| > 1e-8).
3. Reliability bins are equal-width on the prediction, weighted by the examples' weights (leaf counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trace_gym.tree_stats import bottom_up_values, contrastive_pairs, is_mixed, tree_arrays


def nonzero_fraction(advantages: np.ndarray, tokens: np.ndarray | None = None) -> float:
    """Share of trained nodes (NaN = untrained) with |A| > 1e-8, weighted by token counts if given."""
    adv = np.asarray(advantages, dtype=np.float64)
    trained = np.isfinite(adv)
    w = np.ones_like(adv) if tokens is None else np.asarray(tokens, dtype=np.float64)
    total = float(w[trained].sum())
    return float(w[trained & (np.abs(np.nan_to_num(adv)) > 1e-8)].sum() / total) if total > 0 else 0.0


def brier(pred: np.ndarray, target: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Weighted mean squared error between predicted probabilities and (soft) targets."""
    p, t = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    return float(np.sum(w * (p - t) ** 2) / w.sum()) if w.sum() > 0 else float("nan")


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their average rank); NaN below 3 points or when either side is
    constant, where no ranking can be read."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 3:
        return float("nan")
    ra, rb = _average_ranks(a), _average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _average_ranks(x: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    return (first + (counts - 1) / 2.0)[inverse]


# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond 30 the normal 1.96 is close enough.
def reliability_bins(pred: np.ndarray, target: np.ndarray, weights: np.ndarray | None = None,
                     n_bins: int = 10) -> list[dict[str, float]]:
    """Per equal-width bin of the prediction: bounds, total weight, mean prediction and mean target."""
    p, t = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    idx = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    out = []
    for b in range(n_bins):
        sel = idx == b
        wb = float(w[sel].sum())
        out.append({"lo": b / n_bins, "hi": (b + 1) / n_bins, "weight": wb,
                    "pred": float(np.sum(w[sel] * p[sel]) / wb) if wb > 0 else float("nan"),
                    "target": float(np.sum(w[sel] * t[sel]) / wb) if wb > 0 else float("nan")})
    return out


def expected_calibration_error(bins: Sequence[dict[str, float]]) -> float:
    """Σ_b weight_b |pred_b - target_b| / Σ weight over non-empty bins."""
    total = sum(b["weight"] for b in bins)
    if total <= 0:
        return float("nan")
    return float(sum(b["weight"] * abs(b["pred"] - b["target"]) for b in bins if b["weight"] > 0) / total)


def _action_tokens(node: Any) -> int:
    if node.token_ids is not None:
        return len(node.token_ids)
    return int(node.info.get("tokens", 0)) if isinstance(node.info, dict) else 0


def tree_metrics(trees: Sequence[Any], advantages: Sequence[Mapping[int, float]]) -> dict[str, float]:
    """Namespaced metrics of one step's trees (``RolloutTree``s): effective ratios, pairs, success, sizes.
    ``advantages`` holds, per tree, the advantage of each trained node by node id (the update's, computed once
    by the step); a node without one is untrained.

    Generated tokens are the action token ids' lengths (``info["tokens"]`` when a tree has no token ids).
    """
    mixed, pairs, leaves, nodes, tokens, successes = 0, 0, 0, 0, 0, 0.0
    advs, adv_tokens = [], []
    for tree, tree_advantages in zip(trees, advantages, strict=True):
        a = tree_arrays(tree)
        values, counts = bottom_up_values(a.parents, a.rewards, a.is_leaf)
        mixed += is_mixed(a.rewards, a.is_leaf)
        pairs += contrastive_pairs(a.parents, values, counts)
        leaves += int(a.is_leaf.sum())
        successes += float(a.rewards[a.is_leaf].sum())
        nodes += len(a.parents) - 1
        node_tokens = np.array([_action_tokens(n) for n in tree.nodes], dtype=np.float64)
        tokens += int(node_tokens.sum())
        advs.append(np.array([tree_advantages.get(int(i), np.nan) for i in a.ids], dtype=np.float64))
        adv_tokens.append(node_tokens)
    n = max(len(trees), 1)
    adv = np.concatenate(advs) if advs else np.zeros(0)
    tok = np.concatenate(adv_tokens) if adv_tokens else np.zeros(0)
    return {
        "rollout/prompts": float(len(trees)),
        "rollout/trajectories": float(leaves),
        "rollout/nodes": float(nodes),
        "rollout/tokens": float(tokens),
        "rollout/success": successes / leaves if leaves else float("nan"),
        "alloc/effective_ratio": mixed / n,
        "alloc/effective_ratio_sample": nonzero_fraction(adv),
        "alloc/effective_ratio_token": nonzero_fraction(adv, tok) if tokens else float("nan"),
        "alloc/pairs": float(pairs),
        "alloc/pairs_per_trajectory": pairs / leaves if leaves else 0.0,
        "alloc/pairs_per_1k_tokens": 1000.0 * pairs / tokens if tokens else float("nan"),
    }


def calibration_metrics(pred: np.ndarray, target: np.ndarray, weights: np.ndarray,
                        n_bins: int = 10) -> dict[str, Any]:
    """``predictor/brier``, ``predictor/ece`` and the reliability bins (a list, for JSONL)."""
    bins = reliability_bins(pred, target, weights, n_bins)
    return {"predictor/brier": brier(pred, target, weights), "predictor/ece": expected_calibration_error(bins),
            "predictor/reliability": bins}
