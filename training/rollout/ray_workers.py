"""Tree rollouts on Ray: actors each own a pool of envs and a policy (a vLLM engine on GPU clusters); the
driver dispatches roots and branches and gathers the trees.

`RayTreeCollector` is a `Collector` (collector.py) like `TreeCollector`, so the trainer switches with
`distributed: ray`.

Choices:
1. The unit of placement is a tree: a prompt's tree lives on one worker for the step, and its continuations go
   there, where its native snapshots are. Node ids are then numbered exactly as the in-process collector numbers
   them, and every rollout keeps its global index in the stage call (its sampling seeds), so a seeded policy
   gives the same trees as `TreeCollector` on one machine.
2. New trees go to the least-loaded live worker (rollouts started this step; ties to the lowest index).
3. Fault tolerance: after every finished stage call the driver holds each tree and the tree root's portable
   (replay) snapshot. When a worker dies, its unfinished calls are re-run on live workers from the driver's copy
   of the tree as it was before the call, restoring open nodes from replay snapshots. Partial work of the dead
   worker is discarded, so the re-run adds each trajectory once and the budget is the one asked for.
4. Scripted experts draw from one generator in call order, which depends on how branches are batched; for
   trees that do not depend on placement use `ExpertPolicy` with an expert factory,
   which seeds a fresh expert per request.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym

from trace_gym.agents.policy import Policy, SamplingParams
from trace_gym.env_mix import EnvMix
from trace_gym.env_specs import EnvFactory
from trace_gym.errors import TraceGymError
from trace_gym.experts import Expert
from trace_gym.snapshot import ReplaySnapshot, SnapshotKind
from trace_gym.tasks import Task
from trace_gym.training.config import RayConfig
from trace_gym.training.rollout.collector import (
    CollectStats,
    SnapshotPolicy,
    TreeCollector,
    bare_starts,
    continuation_starts,
)
from trace_gym.tree import RolloutTree

__all__ = ["EnvExpert", "RayTreeCollector", "RolloutWorker", "init_ray"]

Start = tuple[str, int, int]  # (task id, node id, global rollout index in the stage call)


def init_ray(cfg: RayConfig) -> None:
    """Connect to ``cfg.address`` or start a local cluster (no dashboard, no usage stats); no-op if connected."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return
    kwargs = {"include_dashboard": False, **cfg.init}
    if cfg.address is not None:
        kwargs["address"] = cfg.address
        kwargs.pop("num_cpus", None)  # resources belong to the existing cluster
    ray.init(**kwargs)


# --------------------------------------------------------------------------------------------- seeded experts
class EnvExpert:
    """A picklable ``seed -> Expert`` factory over any env spec (the spec's `EnvFactory.expert`; each process that
    unpickles it builds its own env for the answer)."""

    def __init__(self, env_id: str, noise: float = 0.0, env_kwargs: Mapping[str, Any] | None = None):
        self.noise, self.factory = noise, EnvFactory(env_id, dict(env_kwargs or {}))

    def __call__(self, seed: int) -> Expert:
        return self.factory.expert(noise=self.noise, seed=seed)


# --------------------------------------------------------------------------------------------- the worker
class _WorkerCollector(TreeCollector):
    """`TreeCollector` that also keeps each tree root's portable snapshot, for the driver's copy of the tree."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.roots: dict[str, ReplaySnapshot] = {}  # each tree's root as a portable snapshot

    def open_tree(self, task_id: str) -> RolloutTree:
        tree = super().open_tree(task_id)
        snap = self._trees[task_id].wrapper.base.snapshot("replay")  # at the root: task and RNG state only
        assert isinstance(snap, ReplaySnapshot)
        self.roots[task_id] = snap
        return tree

    def adopt(self, tree: RolloutTree, root: ReplaySnapshot, nodes: Sequence[int]) -> None:
        super().adopt(tree, root, nodes)
        self.roots[tree.task_id] = root

    def begin_step(self) -> None:
        super().begin_step()
        self.roots = {}

    def export(self, task_ids: Sequence[str]) -> tuple[dict[str, RolloutTree], dict[str, ReplaySnapshot]]:
        trees = self.trees
        return {tid: trees[tid] for tid in task_ids}, {tid: self.roots[tid] for tid in task_ids}


class RolloutWorker:
    """One Ray actor: a policy, a pool of envs and the trees placed on it this step."""

    def __init__(self, make_policy: Callable[[], Policy], make_env: Callable[[], gym.Env] | EnvMix,
                 tasks: Sequence[Task], sampling: SamplingParams, tokenizer: Any = None,
                 snapshot_kind: SnapshotKind = "native", threads: int = 2, max_context: int = 4096,
                 snapshots: SnapshotPolicy | None = None):
        self.policy = make_policy()
        self.collector = _WorkerCollector(self.policy, make_env, tasks, sampling, tokenizer, snapshot_kind,
                                          threads, max_context, snapshots)

    def begin_step(self) -> None:
        self.collector.begin_step()

    def run(self, opens: Sequence[str], starts: Sequence[Start], seed: int,
            adopt: Mapping[str, tuple[RolloutTree, ReplaySnapshot]]
            ) -> tuple[dict[str, RolloutTree], dict[str, ReplaySnapshot], CollectStats]:
        """Adopt trees, open new ones, run the starts; return the touched trees, their root snapshots, stats."""
        for tid, (tree, root) in adopt.items():
            self.collector.adopt(tree, root, [node for t, node, _ in starts if t == tid])
        for tid in opens:
            self.collector.open_tree(tid)
        stats = self.collector.run([(t, node) for t, node, _ in starts], seed, [index for *_, index in starts])
        touched = list(dict.fromkeys([*opens, *adopt, *(t for t, _, _ in starts)]))
        return (*self.collector.export(touched), stats)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        self.collector.update_weights(state_dict)

    def close(self) -> None:
        self.collector.close()


# --------------------------------------------------------------------------------------------- the driver
class RayTreeCollector:
    """A `Collector` over Ray actors (see the module docstring). ``make_policy`` and ``make_env`` are called on
    the workers, so they must pickle (module-level functions, `functools.partial`, classes)."""

    def __init__(self, make_policy: Callable[[], Policy], make_env: Callable[[], gym.Env] | EnvMix,
                 tasks: Sequence[Task], sampling: SamplingParams, tokenizer: Any = None,
                 snapshot_kind: SnapshotKind = "native", max_context: int = 4096, ray_config: RayConfig | None = None,
                 snapshots: SnapshotPolicy | None = None):
        if sampling.n != 1:
            raise TypeError(f"expected sampling.n == 1 (branches are separate rows), got {sampling.n}")
        self.cfg = ray_config or RayConfig()
        init_ray(self.cfg)
        import ray

        self.tasks = {t.id: t for t in tasks}
        actor = ray.remote(num_cpus=self.cfg.cpus_per_worker, num_gpus=self.cfg.gpus_per_worker)(RolloutWorker)
        # Any: Ray types the methods of an actor handle only when they are declared with @ray.method.
        self.workers: list[Any] = [actor.remote(make_policy, make_env, list(tasks), sampling, tokenizer, snapshot_kind,
                                     self.cfg.env_threads, max_context, snapshots) for _ in range(self.cfg.workers)]
        self.alive = [True] * len(self.workers)
        self.failures = 0
        """Worker deaths seen so far (each one's unfinished calls were re-run elsewhere)."""
        self._trees: dict[str, RolloutTree] = {}
        self._roots: dict[str, ReplaySnapshot] = {}
        self._owner: dict[str, int] = {}
        self._load: list[int] = [0] * len(self.workers)
        self.on_submit: Callable[[RayTreeCollector], None] | None = None
        """Called after each round of calls is submitted (fault-injection hook for tests)."""

    @property
    def trees(self) -> dict[str, RolloutTree]:
        """This step's trees by task id, in the order the prompts were started."""
        return dict(self._trees)

    def begin_step(self) -> None:
        self._trees.clear()
        self._roots.clear()
        self._owner.clear()
        self._load = [0] * len(self.workers)
        self._call_all(lambda w: w.begin_step.remote())

    def bare_rollouts(self, counts: Mapping[str, int], seed: int) -> CollectStats:
        """Start ``m`` rollouts at the root of each task in ``counts``; each prompt once per step."""
        starts = bare_starts(counts, {*self._trees, *self._owner}, self.tasks)
        new = list(dict.fromkeys(tid for tid, _ in starts))
        for tid in new:
            self._place(tid, int(counts[tid]))
        return self._dispatch([(tid, node, i) for i, (tid, node) in enumerate(starts)], seed, opens=set(new))

    def continuations(self, counts: Mapping[tuple[str, int], int], seed: int) -> CollectStats:
        """Start ``k`` rollouts from each open node in ``counts`` ((task id, node id) -> k)."""
        starts = continuation_starts(counts, self._trees)
        return self._dispatch([(tid, node, i) for i, (tid, node) in enumerate(starts)], seed, opens=set())

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Push new weights to every live worker's policy (one object-store copy shared by all)."""
        import ray

        ref = ray.put(dict(state_dict))
        self._call_all(lambda w: w.update_weights.remote(ref))

    def close(self) -> None:
        import ray

        live = [i for i, ok in enumerate(self.alive) if ok]
        # Close first: envs may hold OS resources (sandbox processes) that a killed actor would leave behind.
        closing = [self.workers[i].close.remote() for i in live]
        ray.wait(closing, num_returns=len(closing), timeout=30)
        for i in live:
            ray.kill(self.workers[i])
        self.alive = [False] * len(self.workers)

    # ----------------------------------------------------------------- internals
    def _live(self) -> list[int]:
        live = [i for i, ok in enumerate(self.alive) if ok]
        if not live:
            raise TraceGymError("every rollout worker has died; fix: check the workers' logs (ray logs) and "
                                "restart the run from its last checkpoint")
        return live

    def _place(self, tid: str, load: int) -> int:
        i = min(self._live(), key=lambda w: (self._load[w], w))
        self._owner[tid] = i
        self._load[i] += load
        return i

    def _call_all(self, call: Callable[[Any], Any]) -> None:
        import ray

        for i in self._live():
            try:
                ray.get(call(self.workers[i]))
            except ray.exceptions.RayActorError:
                self._mark_dead(i)

    def _mark_dead(self, i: int) -> None:
        if self.alive[i]:
            self.alive[i] = False
            self.failures += 1

    def _dispatch(self, starts: list[Start], seed: int, opens: set[str]) -> CollectStats:
        import ray

        stats = CollectStats()
        todo: dict[str, list[Start]] = {}
        for s in starts:
            todo.setdefault(s[0], []).append(s)
        held: dict[int, set[str]] = {}  # trees each worker holds this step (others must be shipped to it)
        for tid, owner in self._owner.items():
            if tid in self._trees:
                held.setdefault(owner, set()).add(tid)
        while todo:
            pending: dict[Any, tuple[int, list[str]]] = {}
            per_worker: dict[int, list[str]] = {}
            for tid in todo:
                known = self._owner.get(tid)
                owner = known if known is not None and self.alive[known] else self._place(tid, len(todo[tid]))
                per_worker.setdefault(owner, []).append(tid)
            for w, tids in per_worker.items():
                adopt = {t: (self._trees[t], self._roots[t]) for t in tids
                         if t in self._trees and t not in held.get(w, set())}
                new = [t for t in tids if t in opens and t not in self._trees]
                items = sorted((s for t in tids for s in todo[t]), key=lambda s: s[2])
                pending[self.workers[w].run.remote(new, items, seed, adopt)] = (w, tids)
            if self.on_submit is not None:
                self.on_submit(self)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                w, tids = pending.pop(ready[0])
                try:
                    trees, roots, part = ray.get(ready[0])
                except ray.exceptions.RayActorError:
                    self._mark_dead(w)  # its trees stay in `todo` and are placed again in the next round
                    continue
                stats += part
                for t in tids:
                    del todo[t]
                held.setdefault(w, set()).update(tids)
                self._trees.update(trees)
                self._roots.update(roots)
        self._trees = {t: self._trees[t] for t in self._owner if t in self._trees}  # start order
        return stats
