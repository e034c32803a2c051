"""The tree collector: tree invariants, exact budget, no turn generated twice, exact token records."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.training.parity_env import ParityEnv
from trace_gym import RolloutTree
from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.environments.math.env import ArithmeticEnv
from trace_gym.training.rollout.collector import TreeCollector, context_ids


def check_invariants(tree: RolloutTree) -> None:
    for node in tree.nodes:
        assert tree.nodes[node.id] is node
        for c in node.children:
            assert tree[c].parent == node.id and tree[c].depth == node.depth + 1
        if node.is_terminal:
            assert node.children == []
        if node.parent is not None:
            assert node.id in tree[node.parent].children and node.action is not None


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory):
    from trace_gym.agents.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("nano"), size="nano", seed=0)


@pytest.fixture(scope="module")
def arithmetic():
    env = ArithmeticEnv(n_tasks=20, difficulty=2)
    tasks = list(env.tasks)
    collector = TreeCollector(ExpertPolicy(env.expert(noise=0.4, seed=0)), lambda: ArithmeticEnv(n_tasks=20),
                              tasks, SamplingParams(), workers=2)
    yield collector, tasks
    collector.close()
    env.close()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(roots=st.lists(st.integers(0, 3), min_size=1, max_size=3), k=st.integers(0, 2), seed=st.integers(0, 99))
def test_budget_is_conserved_and_trees_are_valid(arithmetic, roots, k, seed):
    collector, tasks = arithmetic
    collector.begin_step()
    counts = {tasks[i].id: m for i, m in enumerate(roots)}
    bare = collector.bare_rollouts(counts, seed=seed)
    plan = {(tid, n.id): k for tid, tree in collector.trees.items() for n in tree.nodes
            if n.depth >= 1 and not n.is_terminal}
    cont = collector.continuations(plan, seed=seed + 1)
    assert bare.trajectories == sum(roots) and cont.trajectories == k * len(plan)
    trees = collector.trees
    assert set(trees) == {tid for tid, m in counts.items() if m > 0}
    for tid, tree in trees.items():
        check_invariants(tree)
        extra = sum(kk for (t, _), kk in plan.items() if t == tid)
        assert tree.leaf_count() == counts[tid] + extra  # one new leaf per started trajectory
    nodes = sum(len(t) - 1 for t in trees.values())
    assert bare.env_steps + cont.env_steps == nodes  # every turn was generated and played exactly once


def test_continuations_start_at_their_node(arithmetic):
    collector, tasks = arithmetic
    collector.begin_step()
    collector.bare_rollouts({tasks[0].id: 2}, seed=0)
    tree = collector.trees[tasks[0].id]
    node = next(n for n in tree.nodes if n.depth == 1 and not n.is_terminal)
    before = len(tree)
    collector.continuations({(tasks[0].id, node.id): 3}, seed=1)
    new = tree.nodes[before:]
    assert sum(n.parent == node.id for n in new) == 3
    # the restored env saw node's history: every continuation's first message list extends node's actions
    for leaf in tree.leaves(node.id):
        assert tree.actions(leaf.id)[:1] == [node.action]


def test_token_record_reproduces_behaviour_logprobs(nano_dir):
    from trace_gym.agents.hf import HFPolicy, sequence_logprobs

    policy = HFPolicy.from_pretrained(nano_dir)
    env = ParityEnv()
    sampling = SamplingParams(temperature=0.8, max_new_tokens=6, min_new_tokens=1)
    collector = TreeCollector(policy, ParityEnv, list(env.tasks), sampling, tokenizer=policy.tokenizer)
    try:
        collector.begin_step()
        collector.bare_rollouts({"p0-0": 2, "p0-1": 1}, seed=3)
        tree = collector.trees["p0-0"]
        collector.continuations({("p0-0", tree.nodes[1].id): 2}, seed=4)
        checked = 0
        for tree in collector.trees.values():
            for node in tree.nodes[1:]:
                ctx = context_ids(tree, node.id)
                assert len(ctx) == node.prompt_tokens
                ids = torch.tensor([ctx + node.token_ids])
                with torch.no_grad():
                    lp = sequence_logprobs(policy.model, ids, temperature=0.8)[0, len(ctx) - 1:]
                np.testing.assert_allclose(lp.numpy(), node.logprobs, atol=1e-4)
                checked += 1
        assert checked >= 8
    finally:
        collector.close()


def test_an_adopted_tree_continues_as_in_the_collector_that_started_it():
    env = ArithmeticEnv(n_tasks=20, difficulty=2)
    task = env.tasks[0]

    def make():
        return ArithmeticEnv(n_tasks=20, difficulty=2)

    policy = ExpertPolicy(lambda s: env.expert(noise=0.4, seed=s))  # each turn from its own seeded expert
    first, second = (TreeCollector(policy, make, env.tasks, SamplingParams(), workers=1) for _ in range(2))
    probe = make()
    try:
        first.begin_step()
        first.bare_rollouts({task.id: 3}, seed=0)
        copy = RolloutTree.from_dict(first.trees[task.id].to_dict())  # as another process would receive it
        node, before = next((n.id for n in copy if n.depth >= 1 and not n.is_terminal), 0), len(copy)
        probe.reset(options={"task": task})
        second.begin_step()
        second.adopt(copy, probe.snapshot("replay"), [node])
        second.run([(task.id, node)] * 2, seed=1)
        first.continuations({(task.id, node): 2}, seed=1)
        assert second.trees[task.id].to_dict() == first.trees[task.id].to_dict()
        assert second.trees[task.id] is copy and len(copy) > before  # it took the tree over and continued it
    finally:
        probe.close()
        first.close()
        second.close()
        env.close()


@pytest.mark.parametrize("kind", ["local", "simulation"])
def test_every_collector_refuses_the_same_bad_starts(kind):
    from trace_gym.training.simulation import SimCollector, make_tasks

    env = None
    if kind == "local":
        env = ArithmeticEnv(n_tasks=6)
        tasks = list(env.tasks)
        collector = TreeCollector(ExpertPolicy(env.expert()), lambda: ArithmeticEnv(n_tasks=6), tasks,
                                  SamplingParams(), workers=1)
    else:
        tasks = make_tasks(6, seed=0)
        collector = SimCollector(tasks)
    try:
        collector.begin_step()
        collector.bare_rollouts({tasks[0].id: 2}, seed=0)
        with pytest.raises(ValueError, match="each prompt once per step"):
            collector.bare_rollouts({tasks[0].id: 1}, seed=1)
        with pytest.raises(ValueError, match="task id of the collector's task set"):
            collector.bare_rollouts({"no-such-task": 1}, seed=1)
        with pytest.raises(ValueError, match="a prompt started this step"):
            collector.continuations({(tasks[1].id, 0): 1}, seed=1)
        leaf = collector.trees[tasks[0].id].leaves()[0].id
        with pytest.raises(ValueError, match="open \\(non-terminal\\) node"):
            collector.continuations({(tasks[0].id, leaf): 1}, seed=1)
    finally:
        collector.close()
        if env is not None:
            env.close()


def test_a_tree_without_a_token_record_is_refused_not_read_as_empty():
    from trace_gym.errors import TraceGymError

    tree = RolloutTree("t", "prompt")
    node = tree.add(0, "a", "obs", terminated=True)
    node.token_ids, node.logprobs = [5], [-0.1]
    with pytest.raises(TraceGymError, match="without prompt_ids"):
        context_ids(tree, node.id)
    tree.root.prompt_ids = [1, 2]
    assert context_ids(tree, node.id) == [1, 2]
    inner = tree.add(0, "b", "obs")
    inner.token_ids = [6]
    leaf = tree.add(inner.id, "c", "end", terminated=True)
    with pytest.raises(TraceGymError, match=f"node {inner.id}"):
        context_ids(tree, leaf.id)  # the inner node's observation ids are missing
