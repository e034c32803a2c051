"""Tree-aware advantages: one scalar per node, given to that node's action tokens.

Every function takes the tree as arrays (``parents``, ``rewards``, ``is_leaf``; see ``tree_arrays``) and
returns (n,) advantages, NaN for nodes that are not trained (the root, which is the prompt, and nodes with
no finished leaf below them). Values V̂ are the bottom-up targets (mean leaf reward under a node).

Deviations and choices where the paper is silent:
1. A node is trained once, with its own prefix as context, so a shared prefix is not counted once per
   trajectory through it. Its advantage is therefore a function of its subtree, never of one trajectory.
2. ``grpo`` on a tree: a leaf's advantage is its reward normalised over the prompt's leaves,
   (r - mean) / (std + eps); an inner node gets the mean over its leaves, which is (V̂(y) - V̂(root)) /
   (std + eps). On a flat group (no branching) this is exactly GRPO.
3. ``tree_grpo`` (after Tree-GRPO): the prompt has one tree, so the inter-tree term is the ``grpo`` term over
   the prompt's leaves; the intra-tree term normalises the sibling values at every branch point,
   (V̂(y) - mean_sib) / (std_sib + eps), unweighted (each sibling is one sampled continuation of the parent);
   a node without siblings gets no intra term. The two terms are added.
4. ``tree_value`` (after TreeRL): (V̂(y) - V̂(parent)) + (V̂(y) - V̂(root)), divided by sqrt(n_y) so
   nodes with many leaves do not dominate. No std normalisation, as in TreeRL.
5. Standard deviations are population ones (ddof = 0), eps = 1e-6.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.training.config import ADVANTAGE_METHODS, AdvantageMethod
from trace_gym.tree_stats import bottom_up_values, sibling_groups, tree_arrays


def _leaf_stats(rewards: np.ndarray, is_leaf: np.ndarray) -> tuple[float, float]:
    leaf_r = rewards[is_leaf]
    if len(leaf_r) == 0:
        return 0.0, 0.0
    return float(leaf_r.mean()), float(leaf_r.std())


def grpo_advantages(
    parents: np.ndarray, rewards: np.ndarray, is_leaf: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """(V̂(y) - mean leaf reward) / (std leaf reward + eps) for every trained node (deviation 2)."""
    values, counts = bottom_up_values(parents, rewards, is_leaf)
    mean, std = _leaf_stats(np.asarray(rewards, dtype=np.float64), np.asarray(is_leaf, dtype=bool))
    adv = (values - mean) / (std + eps)
    return _mask_untrained(adv, parents, counts)


def sibling_normalised(
    parents: np.ndarray, values: np.ndarray, counts: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """(V̂(y) - mean over y's siblings) / (std + eps) at every branch point; 0 for only children."""
    out = np.zeros(len(parents))
    for members in sibling_groups(np.asarray(parents), counts):
        if len(members) < 2:
            continue
        vals = values[members]
        out[members] = (vals - vals.mean()) / (vals.std() + eps)
    return out


def tree_grpo_advantages(
    parents: np.ndarray, rewards: np.ndarray, is_leaf: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """Inter term (``grpo`` over the prompt's leaves) plus intra term (sibling normalisation), deviation 3."""
    values, counts = bottom_up_values(parents, rewards, is_leaf)
    glob = grpo_advantages(parents, rewards, is_leaf, eps)
    return _mask_untrained(glob + sibling_normalised(parents, values, counts, eps), parents, counts)


def tree_value_advantages(parents: np.ndarray, rewards: np.ndarray, is_leaf: np.ndarray) -> np.ndarray:
    """TreeRL-style ((V̂(y) - V̂(parent)) + (V̂(y) - V̂(root))) / sqrt(n_y), deviation 4."""
    parents = np.asarray(parents, dtype=np.int64)
    values, counts = bottom_up_values(parents, rewards, is_leaf)
    parent_v = values[np.maximum(parents, 0)]
    with np.errstate(invalid="ignore", divide="ignore"):
        adv = ((values - parent_v) + (values - values[0])) / np.sqrt(counts)
    return _mask_untrained(adv, parents, counts)


def _mask_untrained(adv: np.ndarray, parents: np.ndarray, counts: np.ndarray) -> np.ndarray:
    adv = np.array(adv, dtype=np.float64)
    adv[np.asarray(parents) < 0] = np.nan
    adv[np.asarray(counts) == 0] = np.nan
    return adv


def node_advantages(
    parents: np.ndarray, rewards: np.ndarray, is_leaf: np.ndarray, method: AdvantageMethod, eps: float = 1e-6
) -> np.ndarray:
    """Dispatch on ``method``; (n,) advantages, NaN where the node is not trained."""
    if method == "grpo":
        return grpo_advantages(parents, rewards, is_leaf, eps)
    if method == "tree_grpo":
        return tree_grpo_advantages(parents, rewards, is_leaf, eps)
    if method == "tree_value":
        return tree_value_advantages(parents, rewards, is_leaf)
    raise ConfigError(f"expected an advantage method in {ADVANTAGE_METHODS}, got {method!r}")


def tree_advantages(tree: Any, method: AdvantageMethod, eps: float = 1e-6) -> dict[int, float]:
    """{node id: advantage} for every trained node of a ``RolloutTree``."""
    a = tree_arrays(tree)
    adv = node_advantages(a.parents, a.rewards, a.is_leaf, method, eps)
    return {int(i): float(x) for i, x in zip(a.ids, adv) if np.isfinite(x)}
