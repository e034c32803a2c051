"""Ray rollout workers on a local cluster: the same trees as the in-process collector for the same seeds, and a
worker killed while it holds work costs nothing but time (step completes, budget conserved, no duplicates)."""

from __future__ import annotations

import functools
import pickle
import sys
import time

import gymnasium as gym
import pytest

pytest.importorskip("ray")

from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.training.config import RayConfig
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.rollout.ray_workers import EnvExpert, RayTreeCollector
from trace_gym.tree import RolloutTree

ENV_ID = "trace/HotpotQA-v0"
ROOTS = {0: 3, 1: 2, 2: 2, 3: 1, 4: 2}  # task position -> bare rollouts
BARE_SEED, CONT_SEED = 7, 8


class SlowPolicy:
    """Holds each generate call a while, so that a kill surely lands while the worker has work."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    def generate(self, requests, sampling):
        time.sleep(self.delay_s)
        return self.inner.generate(requests, sampling)


def expert_policy(delay_s: float = 0.0):
    policy = ExpertPolicy(EnvExpert(ENV_ID, noise=0.5))
    return SlowPolicy(policy, delay_s) if delay_s else policy


@functools.cache
def tasks():
    return tuple(gym.make(ENV_ID).unwrapped.tasks[:len(ROOTS)])


def root_counts() -> dict[str, int]:
    return {tasks()[i].id: m for i, m in ROOTS.items()}


def continuation_counts(trees) -> dict[tuple[str, int], int]:
    """Two continuations from the first two open prefixes (depth >= 1) of each tree, else from the root."""
    out = {}
    for tid, tree in trees.items():
        open_nodes = [n.id for n in tree if not n.is_terminal and n.depth >= 1][:2] or [0]
        out.update({(tid, n): 2 for n in open_nodes})
    return out


def one_step(collector) -> tuple[dict, int]:
    """Bare rollouts then continuations; returns the trees as dicts and the trajectories spent."""
    collector.begin_step()
    spent = collector.bare_rollouts(root_counts(), BARE_SEED).trajectories
    spent += collector.continuations(continuation_counts(collector.trees), CONT_SEED).trajectories
    return {tid: tree.to_dict() for tid, tree in collector.trees.items()}, spent


@pytest.fixture(scope="module")
def in_process():
    collector = TreeCollector(expert_policy(), functools.partial(gym.make, ENV_ID), tasks(), SamplingParams(),
                              workers=1)
    try:
        trees, spent = one_step(collector)
    finally:
        collector.close()
    assert any(len(t["nodes"]) > 1 + ROOTS[0] for t in trees.values())  # continuations happened
    return trees, spent


def ray_collector(delay_s: float = 0.0) -> RayTreeCollector:
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the tests package
    return RayTreeCollector(functools.partial(expert_policy, delay_s), functools.partial(gym.make, ENV_ID), tasks(),
                            SamplingParams(), ray_config=RayConfig(workers=2, env_threads=1))


def test_ray_trees_equal_in_process_trees(ray_cluster, in_process):
    collector = ray_collector()
    try:
        trees, spent = one_step(collector)
        placed = set(collector._owner.values())
    finally:
        collector.close()
    assert placed == {0, 1}  # both workers held trees
    assert list(trees) == list(in_process[0])
    assert trees == in_process[0]
    assert spent == in_process[1]


@pytest.mark.parametrize("stage", ["bare", "continuations"])
def test_worker_killed_mid_step_reruns_its_work_elsewhere(ray_cluster, in_process, stage):
    import ray

    collector = ray_collector(delay_s=0.1)
    calls = []

    def kill_first_worker(c: RayTreeCollector) -> None:
        calls.append(stage)
        if len(calls) == (1 if stage == "bare" else 2):  # round 1 of the named stage call
            ray.kill(c.workers[0])

    collector.on_submit = kill_first_worker
    try:
        trees, spent = one_step(collector)
        alive, failures = list(collector.alive), collector.failures
    finally:
        collector.close()
    assert failures == 1 and alive == [False, True]  # the kill hit a call in flight
    continued = continuation_counts({tid: RolloutTree.from_dict(d) for tid, d in in_process[0].items()})
    assert spent == sum(ROOTS.values()) + sum(continued.values())
    for tid, tree in trees.items():  # budget: one leaf per started rollout, none twice
        leaves = [n for n in tree["nodes"] if n["terminated"] or n["truncated"]]
        assert len(leaves) == root_counts()[tid] + sum(k for (t, _), k in continued.items() if t == tid)
    assert trees == in_process[0]


def test_adopted_tree_continues_exactly_with_token_records():
    """The recovery path without Ray: a tree exported by one worker and adopted by another (open nodes restored
    from replay snapshots, token records rebuilt from the tree) continues exactly as in one collector."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Qwen3ForCausalLM

    from tests.training.parity_env import ParityEnv
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.tiny import build_config, build_tokenizer
    from trace_gym.training.rollout.ray_workers import _WorkerCollector

    tok = build_tokenizer()
    torch.manual_seed(0)
    policy = HFPolicy(Qwen3ForCausalLM(build_config(tok, "nano")).eval(), tok)
    make_env, env_tasks = ParityEnv, ParityEnv().tasks
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    roots = {t.id: m for t, m in zip(env_tasks, (3, 2))}

    ref = TreeCollector(policy, make_env, env_tasks, sampling, tok, workers=1)
    ref.begin_step()
    ref.bare_rollouts(roots, BARE_SEED)
    counts = continuation_counts(ref.trees)
    ref.continuations(counts, CONT_SEED)
    want = {tid: t.to_dict() for tid, t in ref.trees.items()}

    first, second = (_WorkerCollector(policy, make_env, env_tasks, sampling, tok, workers=1) for _ in range(2))
    for tid in roots:
        first.open_tree(tid)
    first.run([(tid, 0) for tid, m in roots.items() for _ in range(m)], BARE_SEED)
    trees, root_snaps = first.export(list(roots))
    starts = [(tid, node) for (tid, node), k in counts.items() for _ in range(k)]
    for tid in roots:
        tree = RolloutTree.from_dict(trees[tid].to_dict())  # a copy, as if shipped from another process
        second.adopt(tree, root_snaps[tid], [n for t, n in starts if t == tid])
    second.run(starts, CONT_SEED, indices=range(len(starts)))
    got = {tid: tree.to_dict() for tid, tree in second.trees.items()}
    for c in (ref, first, second):
        c.close()
    assert any(n["token_ids"] for t in got.values() for n in t["nodes"][1:])  # token records were kept
    assert got == want


def nano_policy(seed: int = 0):
    import torch
    from transformers import Qwen3ForCausalLM

    from trace_gym.agents.hf import HFPolicy
    from trace_gym.agents.tiny import build_config, build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    return HFPolicy(Qwen3ForCausalLM(build_config(tok, "nano")).eval(), tok)


def _same_trees(got: dict, want: dict) -> None:
    """Equal trees; behaviour logprobs to float tolerance (thread counts change summation order)."""
    assert list(got) == list(want)
    for tid in want:
        for a, b in zip(got[tid].nodes, want[tid].nodes, strict=True):
            assert (a.action, a.token_ids, a.observation, a.parent, a.reward) == (b.action, b.token_ids,
                                                                                 b.observation, b.parent, b.reward)
            assert (a.meta, a.prompt_ids, a.obs_ids, a.finish_reason, a.prompt_tokens) == (
                b.meta, b.prompt_ids, b.obs_ids, b.finish_reason, b.prompt_tokens)
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.slow
def test_pushed_weights_reach_the_workers(ray_cluster):
    """Ray trees of a model policy equal in-process ones, before and after `update_weights` with new weights."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    from tests.training.parity_env import ParityEnv

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    policy = nano_policy()
    env_tasks, tok = ParityEnv().tasks, policy.tokenizer
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    roots = {t.id: 2 for t in env_tasks[:4]}

    def step(collector) -> dict:
        collector.begin_step()
        collector.bare_rollouts(roots, BARE_SEED)
        collector.continuations({(tid, 0): 1 for tid in roots}, CONT_SEED)
        return dict(collector.trees)

    local = TreeCollector(policy, ParityEnv, env_tasks, sampling, tok, workers=1)
    remote = RayTreeCollector(nano_policy, ParityEnv, env_tasks, sampling, tok,
                              ray_config=RayConfig(workers=2, env_threads=1))
    try:
        before = step(local)
        _same_trees(step(remote), before)
        new = nano_policy(seed=1).model.state_dict()
        policy.update_weights(new)
        remote.update_weights(new)
        after = step(local)
        _same_trees(step(remote), after)
    finally:
        local.close()
        remote.close()
    assert [n.action for t in after.values() for n in t] != [n.action for t in before.values() for n in t]


def test_a_worker_expert_resolves_a_module_colon_class_spec():
    make_expert = pickle.loads(pickle.dumps(EnvExpert("tests.agents.calc_env:CalcEnv", env_kwargs={"n": 10})))
    expert = make_expert(0)
    assert expert.act(None, [{"role": "tool", "content": "7"}]) == "<answer>7</answer>"
