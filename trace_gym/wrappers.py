"""``TreeRolloutWrapper``: records every step into a ``RolloutTree`` and forks the env at any visited turn."""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym

from trace_gym.env import TextEnv
from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.snapshot import Snapshot
from trace_gym.tree import RolloutTree


class TreeRolloutWrapper(gym.Wrapper[str, str, str, str]):
    """A normal wrapper whose one new verb is ``branch(node_id)``: the next step becomes a new sibling.

    Every non-terminal node keeps a snapshot (``snapshot_kind``) until the next ``reset`` or ``close``;
    ``info["node_id"]`` names the node a step created.
    """

    def __init__(self, env: gym.Env[str, str], snapshot_kind: Literal["native", "replay"] = "native"):
        super().__init__(env)
        if not isinstance(env.unwrapped, TextEnv):
            raise ConfigError(f"expected a trace_gym TextEnv underneath, got {type(env.unwrapped).__name__}")
        if snapshot_kind not in ("native", "replay"):
            raise ConfigError(f"expected snapshot_kind 'native' or 'replay', got {snapshot_kind!r}")
        self.snapshot_kind = snapshot_kind
        self.tree: RolloutTree | None = None
        self.node_id = 0
        self._snapshots: dict[int, Snapshot] = {}

    @property
    def base(self) -> TextEnv:
        """The wrapped ``TextEnv`` itself (``env.unwrapped``)."""
        env = self.env.unwrapped
        assert isinstance(env, TextEnv)
        return env

    @property
    def snapshots(self) -> dict[int, Snapshot]:
        """Snapshots of the non-terminal nodes by node id (read them; do not release them)."""
        return self._snapshots

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Release the old tree's snapshots, reset the env and start a new tree whose root is the task prompt
        (``info["node_id"] == 0``)."""
        self._release()
        obs, info = self.env.reset(seed=seed, options=options)
        # The root keeps the opening messages and tool schemas so that a saved tree can be re-rendered.
        root_info = {"task_id": info["task_id"], "messages": info["messages"], "tools": info.get("tools", [])}
        self.tree = RolloutTree(info["task_id"], obs, info=root_info)
        self.node_id = 0
        self._snapshots[0] = self.base.snapshot(self.snapshot_kind)
        return obs, {**info, "node_id": 0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Step the env and add the turn as a child of the current node (snapshotted unless it ends the episode);
        ``info["node_id"]`` is the new node."""
        if self.tree is None:
            raise TraceGymError("expected reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        node = self.tree.add(self.node_id, action, obs, reward, terminated, truncated, info)
        self.node_id = node.id
        if not (terminated or truncated):
            self._snapshots[node.id] = self.base.snapshot(self.snapshot_kind)
        return obs, reward, terminated, truncated, {**info, "node_id": node.id}

    def branch(self, node_id: int) -> tuple[str, dict[str, Any]]:
        """Restore the env to just after ``node_id``'s observation; the next step adds a child of it."""
        if self.tree is None:
            raise TraceGymError("expected reset() before branch()")
        node = self.tree[node_id]
        if node.is_terminal:
            raise TraceGymError(f"expected a non-terminal node to branch from, got terminal node {node_id}")
        obs, info = self.base.restore(self._snapshots[node_id])
        self.node_id = node_id
        return obs, {**info, "node_id": node_id}

    def adopt(self, tree: RolloutTree, snapshots: dict[int, Snapshot]) -> None:
        """Continue ``tree``, recorded by another wrapper (another process), from this one: ``snapshots`` (by
        node id, e.g. replay snapshots of its open nodes) replace this wrapper's; call ``branch`` next."""
        self._release()
        self.tree, self.node_id = tree, 0
        self._snapshots.update(snapshots)

    def close(self) -> None:
        """Release every snapshot, then close the env."""
        self._release()
        super().close()

    def _release(self) -> None:
        for snap in self._snapshots.values():
            snap.release()
        self._snapshots.clear()
