"""Tree rollout collection: a `Policy` drives one `TreeRolloutWrapper` per prompt, all branches in lockstep.

Two stage functions: `bare_rollouts({task_id: m})` starts m rollouts at each prompt's root and
`continuations({(task_id, node_id): k})` starts k rollouts from a restored node. Every started rollout runs to
a terminal node, and each turn of every active rollout goes into one batched `generate` call; env steps run
in a thread pool, one job per tree (a wrapper holds one env state, so a tree's branches step in turn, each
restoring its node first when the env is elsewhere). No turn is generated twice: a continuation begins with a
new child of its node. `open_tree`, `run` (starts with their seeding indices) and `adopt` (a tree from another
collector) are the stages' building blocks, which Ray workers (ray_workers.py) call directly.

`Collector` is the protocol every collector keeps (this one, `ray_workers.RayTreeCollector` and
`simulation.SimCollector`); `bare_starts` and `continuation_starts` are the checks they share.

Budget: every started rollout is one trajectory and ends in exactly one new leaf; generated tokens, env
steps, tool calls and generate calls are counted beside.

Token record (when a tokenizer is given), in the nodes' typed fields: the root keeps `prompt_ids` (the
rendered prompt), every node keeps its sampled `token_ids`/`logprobs`, `finish_reason` and `prompt_tokens` and,
when not terminal, `obs_ids` (the template's rendering of what followed: observation messages and the next
generation prompt). `path_tokens(tree, node)` reads the record along a path (agents/chat.py's `Conversation`
rules); `context_ids(tree, node)` is exactly the ids its action was sampled after.

Snapshots (`SnapshotPolicy`): every node keeps one that holds no OS resource and costs nothing until restored
(the sandbox re-runs the path's cells at the next cell). Only where a branch can grow, a bare rollout's node of
a branching allocator whose path is costly to replay, does the tree keep a native one (a frozen sandbox
process), and those are released as soon as the step's plan is known.

Choices:
1. A branch whose next prompt would exceed `max_context` tokens is cut: its node becomes a leaf with
   `truncated=True`, reward 0 and `info["stop_reason"] = "max_context"`.
2. The sampling seed of a turn depends on (step seed, rollout index within the stage call, turn), never on
   batch composition, so runs repeat exactly with a fixed seed.
3. A node's replay cost is the env time of its path as played (a step right after a restore counts at least
   as the whole path: a resource-free restore replays it there); the snapshot kind changes what a restore costs,
   never what it restores.
4. A generation that failed (`Generation.error`: a server request out of retries) ends its rollout without an
   env step: a leaf with no action, `truncated=True`, reward 0, `info["stop_reason"] = "server_error"` and the
   error in `info["error"]`; the other rollouts go on. An env step that shared infrastructure failed (the env's
   `info["stop_reason"] = "infra_error"`, `errors.InfraError`) ends its rollout the same way, counted in
   `infra_errors`. Neither leaf has an outcome: `tree_stats` leaves both out of values, advantages and the
   predictor's targets (`tree_stats.UNSCORED`), so the update never learns from them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Container, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym

from trace_gym.agents.chat import Conversation, Segment
from trace_gym.agents.native_tools import ToolFormat
from trace_gym.agents.policy import Generation, Policy, Request, SamplingParams
from trace_gym.env_mix import EnvMix, env_of
from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.seeds import derive
from trace_gym.snapshot import ReplaySnapshot, SnapshotKind
from trace_gym.tasks import Task
from trace_gym.tree import RolloutTree
from trace_gym.wrappers import TreeRolloutWrapper


@dataclass(frozen=True)
class SnapshotPolicy:
    """Which nodes keep a native snapshot that holds OS resources (a frozen sandbox process). The others keep
    one that holds none (`TextEnv.snapshot(resources=False)`), free until restored."""

    branching: bool = True
    """Whether the continuation stage may branch from the bare rollouts' nodes. False for allocators that never
    expand prefixes (grpo, pcl): their trees hold no native snapshot at all."""
    native_above_s: float = 0.2
    """Least env time of a bare rollout node's path (seconds, what replaying it would cost) for which a branching
    tree keeps a native snapshot there; 0 keeps one at every node the continuation stage may choose."""

    def __post_init__(self) -> None:
        if not self.native_above_s >= 0:
            raise ConfigError(f"expected native_above_s >= 0, got {self.native_above_s}; fix: 0.2")

    @classmethod
    def for_allocator(cls, allocator: Any, budget: Any, native_above_s: float = 0.2) -> SnapshotPolicy:
        """The policy for an `Allocator` spending a `StepBudget`: branching when it gives prefixes a budget."""
        return cls(bool(allocator.prefix_budget(2, budget) > 0), native_above_s)


@dataclass
class CollectStats:
    """Work done by stage calls; `trajectories` is the budget unit."""

    trajectories: int = 0
    generated_tokens: int = 0
    env_steps: int = 0
    tool_calls: int = 0
    generate_calls: int = 0
    context_cuts: int = 0
    server_errors: int = 0
    """Rollouts ended because their generation failed (`Generation.error`: a server request out of retries)."""
    infra_errors: int = 0
    """Rollouts ended because an env step's shared infrastructure failed (`info["stop_reason"] == "infra_error"`)."""
    generate_s: float = 0.0
    env_s: float = 0.0

    def __iadd__(self, other: CollectStats) -> CollectStats:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


class Collector(Protocol):
    """Contract: after `begin_step()`, `bare_rollouts({task id: m})` starts m rollouts at each prompt's root
    (each prompt once per step) and `continuations({(task id, node id): k})` starts k rollouts from open nodes of
    this step's trees; every started rollout runs to a terminal node and counts one trajectory. `trees` holds
    this step's trees by task id in the order their prompts were started. Sampling depends only on (seed,
    rollout index within the call, turn), never on placement or batching. `update_weights` hands new policy
    weights to the collector's generation backends; `close` releases envs and workers."""

    @property
    def trees(self) -> dict[str, RolloutTree]: ...

    def begin_step(self) -> None: ...

    def bare_rollouts(self, counts: Mapping[str, int], seed: int) -> CollectStats: ...

    def continuations(self, counts: Mapping[tuple[str, int], int], seed: int) -> CollectStats: ...

    def update_weights(self, state_dict: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def bare_starts(counts: Mapping[str, int], started: Container[str], tasks: Container[str]) -> list[tuple[str, int]]:
    """The (task id, 0) starts of a `bare_rollouts` call, m per prompt in order, after checking that each prompt
    is a known task not yet ``started`` this step."""
    new = [tid for tid, m in counts.items() if m > 0]
    for tid in new:
        if tid in started:
            raise ValueError(f"expected each prompt once per step, got {tid!r} twice; fix: use continuations "
                              "(node 0) for more rollouts from a started prompt")
        if tid not in tasks:
            raise ValueError(f"expected a task id of the collector's task set, got {tid!r}")
    return [(tid, 0) for tid in new for _ in range(int(counts[tid]))]


def continuation_starts(counts: Mapping[tuple[str, int], int], trees: Mapping[str, RolloutTree]
                        ) -> list[tuple[str, int]]:
    """The (task id, node id) starts of a `continuations` call, k per node in order, after checking `check_open`."""
    starts = [(tid, int(node_id)) for (tid, node_id), k in counts.items() for _ in range(max(int(k), 0))]
    check_open(starts, trees)
    return starts


def check_open(starts: Sequence[tuple[str, int]], trees: Mapping[str, RolloutTree]) -> None:
    """Each start names a tree started this step and an open (non-terminal) node of it."""
    for tid, node_id in starts:
        tree = trees.get(tid)
        if tree is None:
            raise ValueError(f"expected a prompt started this step, got {tid!r}; fix: bare_rollouts first")
        if tree[node_id].is_terminal:
            raise ValueError(f"expected an open (non-terminal) node to continue, got terminal node {node_id}")


@dataclass
class _Tree:
    """One prompt's tree and the per-node state needed to continue from any of its nodes."""

    wrapper: TreeRolloutWrapper
    task: Task
    env: str = ""  # its env's key in a mix (`_wrapper`), "" for a collector of one env
    messages: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # env messages after each node
    convs: dict[int, Conversation] = field(default_factory=dict)  # token record at each open node
    tools: ToolFormat | None = None  # a policy's native tool calls (agents/native_tools.py), None for text
    cost: dict[int, float] = field(default_factory=lambda: {0: 0.0})  # env seconds to replay each node's path
    bare: bool = True  # its first run (bare rollouts) is still to come or under way: its nodes may be chosen


@dataclass
class _Branch:
    task_id: str
    node: int
    index: int  # position in the stage call (seeds)
    turn: int = 0
    done: bool = False
    leaf: int = -1  # the node it ended at, once done


def path_tokens(tree: RolloutTree, node_id: int) -> tuple[list[int], list[Segment]]:
    """The token record from the root through ``node_id``'s action and observation: the ids and their segments
    (the prompt, then each node's action and observation; a terminal node's observation is empty)."""
    path = tree.path(node_id)
    if path[0].prompt_ids is None:
        raise TraceGymError(f"expected a token record on tree {tree.task_id!r}, got a root without prompt_ids; "
                            "fix: collect with a tokenizer (TreeCollector(..., tokenizer=...))")
    ids = list(path[0].prompt_ids)
    segments = [Segment("prompt", 0, len(ids))]
    for node in path[1:]:
        if node.token_ids is None or (node.obs_ids is None and not node.is_terminal):
            raise TraceGymError(f"expected the token record of node {node.id} of tree {tree.task_id!r}, got "
                                f"token_ids={node.token_ids is not None}, obs_ids={node.obs_ids is not None}")
        segments.append(Segment("action", len(ids), len(ids) + len(node.token_ids), node.logprobs))
        ids.extend(node.token_ids)
        obs = node.obs_ids or []
        segments.append(Segment("observation", len(ids), len(ids) + len(obs)))
        ids.extend(obs)
    return ids, segments


def context_ids(tree: RolloutTree, node_id: int) -> list[int]:
    """The token ids that node `node_id`'s action was sampled after (prompt, earlier actions, observations)."""
    ids, segments = path_tokens(tree, node_id)
    return ids[:segments[-2].start] if node_id != 0 else ids


def conversation_at(tokenizer: Any, tree: RolloutTree, node_id: int, messages: Sequence[Mapping[str, Any]]
                    ) -> Conversation:
    """The token record after ``node_id``'s observation, rebuilt from the tree (the layout above)."""
    ids, segments = path_tokens(tree, node_id)
    return Conversation(tokenizer, [dict(m) for m in messages], None, ids, segments)


class TreeCollector:
    """Collects one step's rollout trees. Call `begin_step()`, then the stage functions, then read `trees`.

    `make_env` builds a fresh env (e.g. `lambda: gym.make("trace/Arithmetic-v0")`), or is an `EnvMix` whose
    tasks' namespaced ids name their env (`trace_gym.env_mix`); the collector keeps a pool of wrapped envs per
    env across steps. `tokenizer=None` plays on chat messages only (scripted experts); otherwise
    prompts are the exact token record (see the module docstring).
    """

    def __init__(self, policy: Policy, make_env: Callable[[], gym.Env] | EnvMix, tasks: Sequence[Task],
                 sampling: SamplingParams, tokenizer: Any = None, snapshot_kind: SnapshotKind = "native",
                 workers: int = 4, max_context: int = 4096, snapshots: SnapshotPolicy | None = None):
        if sampling.n != 1:
            raise TypeError(f"expected sampling.n == 1 (branches are separate rows), got {sampling.n}")
        self.policy, self.make_env, self.sampling, self.tokenizer = policy, make_env, sampling, tokenizer
        self.snapshot_kind, self.max_context = snapshot_kind, max_context
        self.snapshots = snapshots or SnapshotPolicy()
        self.tasks = {t.id: t for t in tasks}
        self._pools: dict[str, list[TreeRolloutWrapper]] = {}
        self._trees: dict[str, _Tree] = {}
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trace-env")

    @property
    def trees(self) -> dict[str, RolloutTree]:
        """This step's trees by task id (in the order the prompts were started)."""
        return {tid: t.wrapper.tree for tid, t in self._trees.items() if t.wrapper.tree is not None}

    def begin_step(self) -> None:
        """Forget the previous step's trees (their envs return to the pool)."""
        for t in self._trees.values():
            self._pools.setdefault(t.env, []).append(t.wrapper)
        self._trees.clear()

    def close(self) -> None:
        for w in [*(w for pool in self._pools.values() for w in pool), *(t.wrapper for t in self._trees.values())]:
            w.close()
        self._pools.clear()
        self._trees.clear()
        self._executor.shutdown(wait=True)

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Hand new weights to the policy (one that holds its own copy or engine: `update_weights`)."""
        update = getattr(self.policy, "update_weights", None)
        if update is None:
            raise ConfigError(f"expected a policy with update_weights(state_dict), got {type(self.policy).__name__}")
        update(dict(state_dict))

    def messages(self, task_id: str, node_id: int) -> list[dict[str, Any]]:
        """The env's chat messages after node ``node_id`` of this step's tree of ``task_id`` (the whole episode at a
        leaf); kept for nodes this collector played."""
        return list(self._trees[task_id].messages[node_id])

    # ----------------------------------------------------------------- stages
    def bare_rollouts(self, counts: Mapping[str, int], seed: int) -> CollectStats:
        """Start `m` rollouts at the root of each task in `counts` (task id -> m); each prompt once per step."""
        starts = bare_starts(counts, self._trees, self.tasks)
        for tid in dict.fromkeys(tid for tid, _ in starts):
            self.open_tree(tid)
        return self.run(starts, seed)

    def continuations(self, counts: Mapping[tuple[str, int], int], seed: int) -> CollectStats:
        """Start `k` rollouts from each open node in `counts` ((task id, node id) -> k)."""
        return self.run(continuation_starts(counts, self.trees), seed)

    # ----------------------------------------------------------------- building blocks (also for Ray workers)
    def open_tree(self, task_id: str) -> RolloutTree:
        """Reset an env of the pool to `task_id` and start this step's tree of it (the root only)."""
        env, wrapper = self._wrapper(task_id)
        task = self.tasks[task_id]
        _, info = wrapper.reset(options={"task": task})
        state = _Tree(wrapper, task, env, {0: list(info["messages"])})
        if self.tokenizer is not None:
            state.tools = ToolFormat.for_policy(self.policy, wrapper, self.tokenizer)
            conv = Conversation.start(self.tokenizer, *(state.tools.prompt(info["messages"]) if state.tools
                                                        else (info["messages"], None)))
            state.convs[0] = conv
            wrapper.tree.root.prompt_ids = list(conv.ids)  # type: ignore[union-attr]
        self._trees[task_id] = state
        return wrapper.tree  # type: ignore[return-value]

    def adopt(self, tree: RolloutTree, root: ReplaySnapshot, nodes: Sequence[int]) -> None:
        """Take over ``tree``, started by another collector (e.g. on a worker that died), so that `run` can
        continue from ``nodes``: open nodes restore from ``root`` (the tree root's replay snapshot) replaying
        their actions, and token records are rebuilt from the tree."""
        env, wrapper = self._wrapper(tree.task_id)
        task = self.tasks[tree.task_id]
        wrapper.reset(options={"task": task})
        wrapper.adopt(tree, {node.id: dataclasses.replace(root, actions=tuple(tree.actions(node.id)))
                             for node in tree if not node.is_terminal})
        state = _Tree(wrapper, task, env, bare=False)
        if self.tokenizer is not None:
            state.tools = ToolFormat.for_policy(self.policy, wrapper, self.tokenizer)
        for node_id in sorted(set(nodes)):
            _, info = wrapper.branch(node_id)
            state.messages[node_id] = list(info["messages"])
            if self.tokenizer is not None:
                state.convs[node_id] = conversation_at(self.tokenizer, tree, node_id, info["messages"])
        self._trees[tree.task_id] = state

    def run(self, starts: Sequence[tuple[str, int]], seed: int, indices: Sequence[int] | None = None
            ) -> CollectStats:
        """One rollout per (task id, node id) in `starts`, each from an open node of a tree started this step
        (`open_tree`, `adopt` or a stage call), all in lockstep. ``indices[i]``: start i's position in its
        stage call, which seeds its sampling (default i)."""
        indices = list(range(len(starts))) if indices is None else list(indices)
        if len(indices) != len(starts):
            raise ValueError(f"expected one index per start, got {len(indices)} for {len(starts)}")
        check_open(starts, self.trees)
        continued = {tid for tid, _ in starts if not self._trees[tid].bare}
        if continued:  # the plan is made: only its start nodes may still need a native snapshot this step
            self._release_natives(set(starts))
        stats = CollectStats(trajectories=len(starts))
        active = [_Branch(tid, int(node), i) for (tid, node), i in zip(starts, indices)]
        while active:
            self._turn(active, seed, stats)
            active = [b for b in active if not b.done]
        if continued:  # nothing branches from this step's trees again
            self._release_natives(set())
        for tid, _ in starts:
            self._trees[tid].bare = False
        return stats

    def stream(self, refill: Callable[[int], Sequence[tuple[str, int, int]]], seed: int,
               ended: Callable[[str, int, int], None]) -> CollectStats:
        """Rollouts started as they are asked for, in lockstep: before every generate call ``refill(active)``
        returns the (task id, node id, seeding index) starts to add to the ``active`` ones (from open nodes of trees
        started this step; the caller bounds how many run at once), and ``ended(task id, leaf id, index)`` hears
        each rollout as it ends, in the calling thread. Ends when nothing is active and ``refill`` adds nothing.
        Only bare rollouts' trees are expected here (no native snapshots are released or kept)."""
        stats = CollectStats()
        active: list[_Branch] = []
        while True:
            starts = list(refill(len(active)))
            check_open([(tid, node) for tid, node, _ in starts], self.trees)
            active += [_Branch(tid, int(node), int(i)) for tid, node, i in starts]
            stats.trajectories += len(starts)
            if not active:
                return stats
            self._turn(active, seed, stats)
            for b in active:
                if b.done:
                    ended(b.task_id, b.leaf, b.index)
            active = [b for b in active if not b.done]

    def release(self, task_id: str) -> None:
        """Return the env of this step's tree of ``task_id`` to the pool (the tree object stays readable; the
        collector forgets it)."""
        state = self._trees.pop(task_id)
        self._pools.setdefault(state.env, []).append(state.wrapper)

    # ----------------------------------------------------------------- internals
    def _turn(self, active: list[_Branch], seed: int, stats: CollectStats) -> None:
        """One generate call for every active branch, then their env steps (a thread pool job per tree)."""
        t0 = time.perf_counter()
        gens = self.policy.generate([self._request(b, seed) for b in active], self.sampling)
        stats.generate_s += time.perf_counter() - t0
        stats.generate_calls += 1
        if len(gens) != len(active) or not all(isinstance(g.text, str) for g in gens):
            raise TypeError(f"expected one Generation with text per request from {type(self.policy).__name__}, "
                            f"got {len(gens)} for {len(active)} requests, texts of types "
                            f"{sorted({type(g.text).__name__ for g in gens})}; fix: the policy must follow the "
                            "Policy contract (agents/policy.py)")
        by_tree: dict[str, list[tuple[_Branch, Generation]]] = {}
        for b, g in zip(active, gens):
            by_tree.setdefault(b.task_id, []).append((b, g))
        t0 = time.perf_counter()
        for part in self._executor.map(self._step_tree, by_tree.values()):
            stats += part
        stats.env_s += time.perf_counter() - t0

    def _wrapper(self, task_id: str) -> tuple[str, TreeRolloutWrapper]:
        """(the task's env key, a wrapped env of that env from its pool or new)."""
        env = env_of(task_id) if isinstance(self.make_env, EnvMix) else ""
        pool = self._pools.get(env)
        if pool:
            return env, pool.pop()
        make = self.make_env.factory(env) if isinstance(self.make_env, EnvMix) else self.make_env
        return env, TreeRolloutWrapper(make(), self.snapshot_kind, snapshot_resources=False)

    def _release_natives(self, keep: set[tuple[str, int]]) -> None:
        """Free the OS resources of every continued tree's snapshots but those at ``keep``; released snapshots
        still restore (by rebuilding), so a later call from them is only slower."""
        for tid, state in self._trees.items():
            if not state.bare:
                for node_id, snap in state.wrapper.snapshots.items():
                    if (tid, node_id) not in keep:
                        snap.release()

    def _request(self, b: _Branch, seed: int) -> Request:
        state = self._trees[b.task_id]
        rseed = derive(seed, b.index, b.turn)
        if self.tokenizer is not None:
            return Request(prompt_ids=state.convs[b.node].ids, task=state.task, seed=rseed)
        return Request(messages=state.messages[b.node], task=state.task, seed=rseed)

    def _step_tree(self, items: list[tuple[_Branch, Generation]]) -> CollectStats:
        stats = CollectStats()
        for b, g in items:
            self._step(b, g, stats)
        return stats

    def _step(self, b: _Branch, g: Generation, stats: CollectStats) -> None:
        state = self._trees[b.task_id]
        w = state.wrapper
        if g.error is not None:  # no turn to play: the rollout ends here, the error on record, reward 0
            node = w.tree.add(b.node, "", f"Error: {g.error}", truncated=True,  # type: ignore[union-attr]
                              info={"stop_reason": "server_error", "error": g.error})
            node.token_ids, node.finish_reason = [], "error"
            state.messages[node.id] = list(state.messages[b.node])
            stats.server_errors += 1
            b.done, b.leaf = True, node.id
            return
        restored = w.node_id != b.node
        if restored:
            w.branch(b.node)
        t0 = time.perf_counter()
        obs, _, terminated, truncated, info = w.step(state.tools.text_action(g.text) if state.tools else g.text)
        spent = time.perf_counter() - t0
        node = w.tree[info["node_id"]]  # type: ignore[index]
        # Choice 3: a step after a restore that rebuilt the state already spent the whole path's replay (and one
        # after a native restore continues a path whose cost already passed the bar: the maximum keeps it there).
        before = state.cost.get(b.node, 0.0)  # unknown for an adopted tree's nodes (never native: not bare)
        state.cost[node.id] = max(spent, before) if restored else before + spent
        if (not (terminated or truncated) and state.bare and self.snapshots.branching
                and self.snapshot_kind == "native" and state.cost[node.id] >= self.snapshots.native_above_s):
            w.snapshots.pop(node.id).release()
            w.snapshots[node.id] = w.base.snapshot("native")
        ids = [int(t) for t in g.token_ids]
        if not ids and self.tokenizer is not None:  # a policy that reports no ids: record the turn as ended
            ids = [int(self.tokenizer.eos_token_id)]
        node.token_ids = ids
        node.logprobs = [float(x) for x in g.logprobs] if g.logprobs else None
        node.finish_reason, node.prompt_tokens = g.finish_reason, g.prompt_tokens
        stats.env_steps += 1
        stats.infra_errors += info.get("stop_reason") == "infra_error"
        stats.generated_tokens += len(g.token_ids)
        stats.tool_calls += int(info.get("tool_calls", 0) or 0)
        b.turn += 1
        parent_messages = state.messages[b.node]
        messages = list(info["messages"])
        state.messages[node.id] = messages
        if terminated or truncated:
            b.done, b.leaf = True, node.id
            return
        if self.tokenizer is not None:
            conv = state.convs[b.node].copy()
            conv.add_action(ids, g.text, g.logprobs or None)
            new = messages[len(parent_messages) + 1:] or [{"role": "tool", "content": obs}]
            node.obs_ids = conv.add_observation(new)
            state.convs[node.id] = conv
            if len(conv.ids) + self.sampling.max_new_tokens > self.max_context:
                node.truncated = True
                node.info["stop_reason"] = "max_context"
                stats.context_cuts += 1
                b.done, b.leaf = True, node.id
                return
        b.node = node.id
