"""Rollout trees: the root is the task prompt, every other node is one turn (action -> observation)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trace_gym.errors import TraceGymError
from trace_gym.tree_stats import is_mixed, tree_values

_SKIP_INFO = frozenset({"messages", "tools"})  # rebuilt from the path; not stored per node


def json_safe(info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-serialisable part of a step's info (messages and tool schemas are left out)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in _SKIP_INFO:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


_RECORD = ("prompt_ids", "obs_ids", "finish_reason", "prompt_tokens")


def _typed_record(node: Mapping[str, Any]) -> dict[str, Any]:
    """A node dict with a token record saved in ``meta`` (trees written before it had fields) moved to its
    fields."""
    meta = dict(node.get("meta") or {})
    moved = {k: meta.pop(k) for k in _RECORD if k in meta and node.get(k) is None}
    return {**node, **moved, "meta": meta}


@dataclass
class Node:
    """One turn. The root (``id`` 0, ``depth`` 0) holds the prompt as its observation and no action."""

    id: int
    parent: int | None
    depth: int
    action: str | None
    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    children: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    # The token record, written by a collector given a tokenizer (training/rollout/collector.py).
    token_ids: list[int] | None = None  # the action's sampled token ids
    logprobs: list[float] | None = None  # behaviour logprobs of those tokens
    prompt_ids: list[int] | None = None  # the root only: the rendered prompt's ids
    obs_ids: list[int] | None = None  # a non-terminal node: the template's ids of what followed the action
    finish_reason: str | None = None  # why the action's generation stopped ("stop", "length")
    prompt_tokens: int | None = None  # the length of the context the action was sampled after
    meta: dict[str, Any] = field(default_factory=dict)  # the viewer's annotations (training/step.py)

    @property
    def is_terminal(self) -> bool:
        """Whether the episode ended here (terminated or truncated): no children."""
        return self.terminated or self.truncated


class RolloutTree:
    """All rollouts of one task, sharing prefixes. ``value(node)`` is the mean terminal reward below it."""

    def __init__(self, task_id: str, prompt: str, info: Mapping[str, Any] | None = None):
        self.task_id = task_id
        self.nodes: list[Node] = [Node(id=0, parent=None, depth=0, action=None, observation=prompt,
                                       info=dict(info or {}))]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, node_id: int) -> Node:
        if not 0 <= node_id < len(self.nodes):
            raise TraceGymError(f"expected a node id in 0..{len(self.nodes) - 1}, got {node_id}")
        return self.nodes[node_id]

    @property
    def root(self) -> Node:
        """The root node: the task prompt, no action."""
        return self.nodes[0]

    def add(self, parent: int, action: str, observation: str, reward: float = 0.0, terminated: bool = False,
            truncated: bool = False, info: Mapping[str, Any] | None = None) -> Node:
        """Append a turn under ``parent``; a terminal node cannot have children."""
        parent_node = self[parent]
        if parent_node.is_terminal:
            raise TraceGymError(f"expected a non-terminal parent, got terminal node {parent}")
        node = Node(id=len(self.nodes), parent=parent, depth=parent_node.depth + 1, action=action,
                    observation=observation, reward=float(reward), terminated=terminated, truncated=truncated,
                    info=json_safe(info or {}))
        self.nodes.append(node)
        parent_node.children.append(node.id)
        return node

    # ----------------------------------------------------------------- queries
    def leaves(self, node_id: int = 0) -> list[Node]:
        """Terminal nodes under ``node_id`` (inclusive), in id order."""
        return [self.nodes[i] for i in sorted(self._subtree(node_id)) if self.nodes[i].is_terminal]

    def path(self, node_id: int) -> list[Node]:
        """Nodes from the root down to ``node_id``."""
        out = [self[node_id]]
        while out[-1].parent is not None:
            out.append(self.nodes[out[-1].parent])
        return out[::-1]

    def depth(self) -> int:
        """The largest node depth (turns on the longest path)."""
        return max(n.depth for n in self.nodes)

    def leaf_count(self, node_id: int = 0) -> int:
        """The number of terminal nodes under ``node_id`` (inclusive)."""
        return len(self.leaves(node_id))

    def value(self, node_id: int = 0) -> float | None:
        """Mean terminal reward over the leaves under ``node_id`` (V̂, trace_gym/tree_stats.py); ``None`` if none
        has finished."""
        values, _ = tree_values(self)
        v = float(values[self[node_id].id])
        return None if math.isnan(v) else v

    def is_mixed(self, node_id: int = 0) -> bool:
        """Whether the leaves under ``node_id`` have different rewards (a contrastive signal exists)."""
        rewards = np.array([leaf.reward for leaf in self.leaves(node_id)])
        return is_mixed(rewards, np.ones(len(rewards), dtype=bool))

    def sibling_groups(self) -> list[list[int]]:
        """Children lists of every branch point (a node with two or more children)."""
        return [list(n.children) for n in self.nodes if len(n.children) >= 2]

    def actions(self, node_id: int) -> list[str]:
        """The actions from the root to ``node_id`` (what a replay needs)."""
        return [n.action for n in self.path(node_id)[1:] if n.action is not None]

    def _subtree(self, node_id: int) -> list[int]:
        stack, out = [self[node_id].id], []
        while stack:
            i = stack.pop()
            out.append(i)
            stack.extend(self.nodes[i].children)
        return out

    # ----------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """The tree as a JSON-ready dict (what ``trees.jsonl`` and the viewer hold)."""
        return {"task_id": self.task_id, "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutTree:
        """The tree that ``to_dict()`` gave ``data``."""
        nodes = [Node(**_typed_record(n)) for n in data["nodes"]]
        if not nodes or nodes[0].parent is not None:
            raise TraceGymError("expected a tree dict whose first node is the root (parent None)")
        tree = cls(str(data["task_id"]), nodes[0].observation)
        tree.nodes = nodes
        return tree

    def to_json(self) -> str:
        """``to_dict()`` as one line of JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> RolloutTree:
        """The tree that ``to_json()`` gave ``text``."""
        return cls.from_dict(json.loads(text))
