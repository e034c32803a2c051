"""``TreeRolloutWrapper``: records every step into a ``RolloutTree`` and forks the env at any visited turn.

A branch restores the whole chain under the wrapper, not only ``env.unwrapped``: every wrapper in between must
be one whose state ``branch`` knows how to set (a ``TimeLimit`` counts the branch's turns again from its node).
Gymnasium's common wrappers are known here; a wrapper of your own says how with ``restore_branch(path)``
(``BranchAware``); any other is refused when the ``TreeRolloutWrapper`` is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
from gymnasium import wrappers as gw

from trace_gym.env import TextEnv
from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.snapshot import Snapshot, SnapshotKind
from trace_gym.tree import Node, RolloutTree


@runtime_checkable
class BranchAware(Protocol):
    """A wrapper whose state a branch can set. ``restore_branch(path)`` makes the wrapper's state what it was
    just after the last node of ``path`` (root first) was recorded; the env underneath is already restored. A
    stateless wrapper implements it as a no-op."""

    def restore_branch(self, path: Sequence[Node]) -> None: ...


def _elapsed(w: Any, path: Sequence[Node]) -> None:
    w._elapsed_steps = len(path) - 1


def _episode_stats(w: Any, path: Sequence[Node]) -> None:
    w.episode_returns = sum(n.reward for n in path[1:])
    w.episode_lengths = len(path) - 1


def _has_reset(w: Any, path: Sequence[Node]) -> None:
    w._has_reset = True


def _not_done(w: Any, path: Sequence[Node]) -> None:
    w.autoreset = False  # a branch starts from an open node


def _stateless(w: Any, path: Sequence[Node]) -> None:
    pass


# Gymnasium wrappers by exact type (a subclass may add state): how each one's state follows a branch.
_KNOWN: dict[type, Callable[[Any, Sequence[Node]], None]] = {
    gw.TimeLimit: _elapsed,
    gw.RecordEpisodeStatistics: _episode_stats,
    gw.OrderEnforcing: _has_reset,
    gw.Autoreset: _not_done,
    gw.PassiveEnvChecker: _stateless,  # its flags only say which first-call checks ran
    gw.TransformObservation: _stateless,
    gw.TransformAction: _stateless,
    gw.TransformReward: _stateless,
    gw.ClipReward: _stateless,
}


def _chain(env: gym.Env) -> list[gym.Wrapper]:
    """The wrappers between ``env`` and ``env.unwrapped``, outermost first."""
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def _check_branchable(env: gym.Env) -> None:
    for w in _chain(env):
        if type(w) not in _KNOWN and not isinstance(w, BranchAware):
            raise ConfigError(
                f"expected wrappers under TreeRolloutWrapper whose state a branch can restore, got "
                f"{type(w).__name__}; fix: give {type(w).__name__} a restore_branch(path) method "
                "(trace_gym.wrappers.BranchAware; a no-op if it keeps no state), or apply it outside "
                "TreeRolloutWrapper")


class TreeRolloutWrapper(gym.Wrapper[str, str, str, str]):
    """A normal wrapper whose one new verb is ``branch(node_id)``: the next step becomes a new sibling.

    Every non-terminal node keeps a snapshot (``snapshot_kind``) until the next ``reset`` or ``close``;
    ``info["node_id"]`` names the node a step created. ``snapshot_resources=False``: native snapshots hold no OS
    resource (``TextEnv.snapshot``), so they cost nothing until restored.
    """

    def __init__(self, env: gym.Env[str, str], snapshot_kind: SnapshotKind = "native",
                 snapshot_resources: bool = True):
        super().__init__(env)
        if not isinstance(env.unwrapped, TextEnv):
            raise ConfigError(f"expected a trace_gym TextEnv underneath, got {type(env.unwrapped).__name__}")
        if snapshot_kind not in ("native", "replay"):
            raise ConfigError(f"expected snapshot_kind 'native' or 'replay', got {snapshot_kind!r}")
        _check_branchable(env)
        self.snapshot_kind, self.snapshot_resources = snapshot_kind, snapshot_resources
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
        """Snapshots of the non-terminal nodes by node id. Whoever drives the wrapper may release one early (a
        released snapshot still restores, rebuilding what it freed) or replace one with another snapshot of the
        same node's state; the wrapper releases what it holds at ``reset`` and ``close``."""
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
        self._snapshots[0] = self._snapshot()
        return obs, {**info, "node_id": 0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Step the env and add the turn as a child of the current node (snapshotted unless it ends the episode);
        ``info["node_id"]`` is the new node."""
        if self.tree is None:
            raise TraceGymError("expected reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)  # gymnasium types a reward as SupportsFloat
        node = self.tree.add(self.node_id, action, obs, reward, terminated, truncated, info)
        self.node_id = node.id
        if not (terminated or truncated):
            self._snapshots[node.id] = self._snapshot()
        return obs, reward, terminated, truncated, {**info, "node_id": node.id}

    def branch(self, node_id: int) -> tuple[str, dict[str, Any]]:
        """Restore the env to just after ``node_id``'s observation; the next step adds a child of it."""
        if self.tree is None:
            raise TraceGymError("expected reset() before branch()")
        node = self.tree[node_id]
        if node.is_terminal:
            raise TraceGymError(f"expected a non-terminal node to branch from, got terminal node {node_id}")
        obs, info = self.base.restore(self._snapshots[node_id])
        path = self.tree.path(node_id)
        for w in _chain(self.env):
            if isinstance(w, BranchAware):
                w.restore_branch(path)
            else:
                _KNOWN[type(w)](w, path)
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

    def _snapshot(self) -> Snapshot:
        if self.snapshot_kind == "native" and not self.snapshot_resources:
            return self.base.snapshot("native", resources=False)
        return self.base.snapshot(self.snapshot_kind)

    def _release(self) -> None:
        for snap in self._snapshots.values():
            snap.release()
        self._snapshots.clear()
