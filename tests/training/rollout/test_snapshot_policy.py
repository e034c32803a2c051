"""The collector's snapshot policy, counted in real sandbox processes: flat allocators hold no frozen snapshot
process, branching ones hold them only at the bare rollouts' nodes and only until the plan is made."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.environments.sandbox.leaks import steady_count
from trace_gym.agents.policy import Generation, Request, SamplingParams
from trace_gym.environments.math.env import ArithmeticEnv
from trace_gym.environments.sandbox.host import PythonSandbox, sandbox_processes, start_template
from trace_gym.training.allocation.allocators import make_allocator
from trace_gym.training.allocation.predictor import FeaturePredictor
from trace_gym.training.config import StepBudget
from trace_gym.training.rollout.collector import SnapshotPolicy, TreeCollector
from trace_gym.training.step import take_step
from trace_gym.wrappers import TreeRolloutWrapper

CELLS = 3


class ThreeCells:
    """Runs three cells (each leaves state in the interpreter), then answers: every open node of depth >= 1
    holds sandbox state. Counts the sandbox's processes at every turn (the policy is called once per turn)."""

    def __init__(self, baseline: int):
        self.baseline, self.counts = baseline, []

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        self.counts.append(steady_count() - self.baseline)
        out = []
        for r in requests:
            turn = sum(m["role"] == "assistant" for m in r.messages or [])
            text = f"<python>x{turn} = {turn}\nprint(x{turn})</python>" if turn < CELLS else "<answer>0</answer>"
            out.append(Generation(text, [], [], "stop", 0))
        return out


def make_env() -> ArithmeticEnv:
    return ArithmeticEnv(n_tasks=8, difficulty=1)


@pytest.fixture(autouse=True)
def exact_counts(monkeypatch):
    # The counts below are of lineages and frozen forks: no cell process forked ahead of a cell.
    monkeypatch.setattr(PythonSandbox, "prefork", False)


@pytest.fixture(scope="module")
def baseline() -> int:
    start_template()
    return len(sandbox_processes())


def frozen_processes(collector: TreeCollector, baseline: int) -> int:
    """Sandbox processes that are neither a live lineage's supervisor nor its worker: frozen snapshots."""
    pooled = [w for pool in collector._pools.values() for w in pool]
    wrappers = [*pooled, *(t.wrapper for t in collector._trees.values())]
    live = sum(w.base.sandbox.pid is not None for w in wrappers)
    return steady_count() - baseline - 2 * live


def step(allocator: str, policy: SnapshotPolicy, baseline: int) -> tuple[ThreeCells, TreeCollector, int]:
    tasks = list(make_env().tasks)
    cells = ThreeCells(baseline)
    collector = TreeCollector(cells, make_env, tasks, SamplingParams(), workers=1, snapshots=policy)
    result = take_step(collector, make_allocator(allocator, group_size=4), FeaturePredictor(dim=512), tasks[:4],
                       StepBudget(4, 2), seed=0, step=0)
    return cells, collector, result.stats.trajectories


def test_a_flat_allocator_holds_no_snapshot_process(baseline):
    # native_above_s=0 would keep a native snapshot at every node of a branching tree: grpo still takes none.
    cells, collector, trajectories = step("grpo", SnapshotPolicy.for_allocator(make_allocator("grpo"),
                                                                             StepBudget(4, 2), 0.0), baseline)
    try:
        assert trajectories == 12 and frozen_processes(collector, baseline) == 0
        # at every turn: one lineage (supervisor and worker) per tree at most
        assert max(cells.counts) <= 2 * len(collector.trees)
    finally:
        collector.close()


def test_a_branching_allocator_frees_its_snapshots_once_the_plan_is_made(baseline):
    policy = SnapshotPolicy.for_allocator(make_allocator("treepo"), StepBudget(4, 2), 0.0)
    assert policy.branching
    cells, collector, trajectories = step("treepo", policy, baseline)
    try:
        bare_end = cells.counts[CELLS]  # the bare rollouts' last turn (their answers), every cell played
        bare_rollouts = sum(len(t.root.children) for t in collector.trees.values())
        assert bare_end >= bare_rollouts * CELLS  # the bare stage kept a frozen fork at each open node
        assert frozen_processes(collector, baseline) == 0  # and none outlives the step
        peak = max(cells.counts) / trajectories
    finally:
        collector.close()
    # The same trajectories held as episodes with a native snapshot at every node (what the collector did before).
    episodes = [TreeRolloutWrapper(make_env(), "native") for _ in range(trajectories)]
    try:
        for w in episodes:
            w.reset(options={"index": 0})
            for turn in range(CELLS):
                w.step(f"<python>x{turn} = {turn}\nprint(x{turn})</python>")
        every_node = (len(sandbox_processes()) - baseline) / trajectories
    finally:
        for w in episodes:
            w.close()
    assert every_node >= 2 * peak, (every_node, peak)


def test_the_policy_refuses_a_negative_threshold():
    from trace_gym.errors import ConfigError

    with pytest.raises(ConfigError, match="native_above_s"):
        SnapshotPolicy(native_above_s=-1.0)
