"""Statistics of a rollout tree, in one place: the tree as arrays, the mean leaf reward V̂ under every node (with
its leaf count), whether outcomes are mixed, sibling groups and the contrastive pairs among them. Arrays in,
arrays out; `tree_arrays` reads a ``RolloutTree``. The advantages, the step metrics, the predictor's targets,
stage 2's prefix rewards, the viewer and ``RolloutTree.value`` all read V̂ from here.

A leaf whose episode was cut by a failure of neither the model nor the env's rules (``info["stop_reason"]`` in
``UNSCORED``: a generation out of retries, an infrastructure failure such as no answer checker in time) has no
outcome: it is not a finished leaf here, so it adds no 0 to any value, advantage, target or success count, and
its own turn is not trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

UNSCORED = frozenset({"server_error", "infra_error"})
"""Stop reasons of leaves without an outcome (module docstring)."""


@dataclass(frozen=True)
class TreeArrays:
    """A rollout tree as arrays, nodes in creation order (index i is ``ids[i]``)."""

    ids: np.ndarray  # (n,) node ids
    parents: np.ndarray  # (n,) parent index, -1 for the root
    rewards: np.ndarray  # (n,) step rewards (terminal reward at leaves)
    is_leaf: np.ndarray  # (n,) bool: finished (terminated or truncated), childless and scored (not UNSCORED)
    depth: np.ndarray  # (n,) turn index, root 0


def tree_arrays(tree: Any) -> TreeArrays:
    """Arrays of a ``trace_gym.tree.RolloutTree`` (reads ``nodes``' id, parent, depth, reward, flags)."""
    nodes = tree.nodes
    index = {node.id: i for i, node in enumerate(nodes)}
    parents = np.array([-1 if node.parent is None else index[node.parent] for node in nodes], dtype=np.int64)
    rewards = np.array([float(node.reward) for node in nodes], dtype=np.float64)
    is_leaf = np.array([(node.terminated or node.truncated) and not node.children
                        and node.info.get("stop_reason") not in UNSCORED for node in nodes], dtype=bool)
    depth = np.array([node.depth for node in nodes], dtype=np.int64)
    ids = np.array([node.id for node in nodes], dtype=np.int64)
    return TreeArrays(ids, parents, rewards, is_leaf, depth)


def bottom_up_values(
    parents: np.ndarray, rewards: np.ndarray, is_leaf: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """V̂(y) = Σ_c n_c V̂(c) / n_y, i.e. the mean leaf reward under y, and n_y, the leaf count.

    parents: (n,) parent index per node, -1 for the root; a parent's index is below its children's (nodes
    are appended as the tree grows). rewards: (n,) terminal rewards (read at leaves only). is_leaf: (n,) bool,
    finished nodes (terminated or truncated). Returns (values, counts); values are NaN where n_y = 0.
    """
    parents = np.asarray(parents, dtype=np.int64)
    n = len(parents)
    if np.any(parents[1:] >= np.arange(1, n)) or (n and parents[0] != -1):
        raise ValueError("expected parents[0] == -1 and parents[i] < i (nodes in creation order), "
                         f"got {parents.tolist()}; fix: pass nodes in the order the tree created them")
    leaf = np.asarray(is_leaf, dtype=bool)
    sums = np.where(leaf, np.asarray(rewards, dtype=np.float64), 0.0)
    counts = leaf.astype(np.int64)
    for i in range(n - 1, 0, -1):
        sums[parents[i]] += sums[i]
        counts[parents[i]] += counts[i]
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return values, counts


def tree_values(tree: Any) -> tuple[np.ndarray, np.ndarray]:
    """(V̂, n) per node of a ``RolloutTree`` in creation order: the mean reward of the finished leaves under each
    node (NaN where none has finished) and their count."""
    a = tree_arrays(tree)
    return bottom_up_values(a.parents, a.rewards, a.is_leaf)


def is_mixed(rewards: np.ndarray, is_leaf: np.ndarray) -> bool:
    """Whether the finished leaves hold at least two different rewards (both a 0 and a 1 when binary)."""
    leaf_r = np.asarray(rewards)[np.asarray(is_leaf, dtype=bool)]
    return bool(len(leaf_r) and leaf_r.min() != leaf_r.max())


def sibling_groups(parents: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    """The indices of each parent's children that have a finished leaf below them, per parent (any size)."""
    groups: dict[int, list[int]] = {}
    for i in range(1, len(parents)):
        if counts[i] > 0:
            groups.setdefault(int(parents[i]), []).append(i)
    return list(groups.values())


def contrastive_pairs(parents: np.ndarray, values: np.ndarray, counts: np.ndarray) -> int:
    """Unordered sibling pairs (same parent, each with a finished leaf) whose values V̂ differ."""
    pairs = 0
    for members in sibling_groups(parents, counts):
        _, sizes = np.unique(np.asarray(values)[members], return_counts=True)
        pairs += len(members) * (len(members) - 1) // 2 - int(np.sum(sizes * (sizes - 1) // 2))
    return pairs
