"""A broken internal invariant (a tensor shape, a collector's or a policy's contract) raises a plain exception
with its traceback, never a ``UserError``, which the ``trace-gym`` command would print as a user's mistake; a
broken contract (what a policy answers, what a collector is asked to sample, an action) is a ``TypeError``."""

from __future__ import annotations

import pytest
import torch

from trace_gym.agents.policy import Generation, SamplingParams
from trace_gym.environments.math.env import ArithmeticEnv
from trace_gym.errors import UserError
from trace_gym.training.allocation.solvers import solve_prefixes
from trace_gym.training.rollout.collector import TreeCollector, bare_starts
from trace_gym.training.rollout.ray_workers import RayTreeCollector
from trace_gym.training.update.batches import UpdateBatch
from trace_gym.training.update.loss import policy_loss
from trace_gym.training.update.packing import pack_rows
from trace_gym.training.update.samples import Sample


class _OneShortPolicy:
    """A policy that answers one request too few (a broken Policy contract)."""

    def generate(self, requests, sampling):
        return [Generation("<answer>1</answer>", [1], [-0.1], "stop", 1) for _ in requests[1:]]


class _BytesPolicy:
    """A policy whose generations hold bytes, not text (a broken Policy contract)."""

    def generate(self, requests, sampling):
        return [Generation(b"<answer>1</answer>", [1], [-0.1], "stop", 1) for _ in requests]


def _policy_breaks_its_contract(policy, sampling=None):
    env = ArithmeticEnv()
    try:
        collector = TreeCollector(policy, ArithmeticEnv, list(env.tasks)[:1], sampling or SamplingParams())
        try:
            collector.begin_step()
            collector.bare_rollouts({env.tasks[0].id: 2}, seed=0)
        finally:
            collector.close()
    finally:
        env.close()


def _a_step_that_is_not_text():
    env = ArithmeticEnv()
    try:
        env.reset(seed=0)
        env.step(42)
    finally:
        env.close()


BUGS = {
    "loss shapes": lambda: policy_loss(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1), torch.ones(1, 2)),
    "update batch shapes": lambda: UpdateBatch(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2),
                                               torch.ones(1, 3), torch.zeros(1, 2), torch.ones(1)),
    "pack logprobs": lambda: pack_rows([Sample([1, 2], [3, 4], [-1.0], 1.0)]),
    "a prompt twice": lambda: bare_starts({"a": 1}, started={"a"}, tasks={"a"}),
    "solver shapes": lambda: solve_prefixes(torch.zeros(2).numpy(), torch.zeros(3).numpy(), 2),
    "policy answers too few": lambda: _policy_breaks_its_contract(_OneShortPolicy()),
    "policy answers bytes": lambda: _policy_breaks_its_contract(_BytesPolicy()),
    "collector asked for n samples": lambda: _policy_breaks_its_contract(_OneShortPolicy(), SamplingParams(n=2)),
    "ray collector asked for n samples": lambda: RayTreeCollector(_OneShortPolicy, ArithmeticEnv, [],
                                                                  SamplingParams(n=2)),
    "an action that is not text": _a_step_that_is_not_text,
}
CONTRACTS = ("policy answers too few", "policy answers bytes", "collector asked for n samples",
             "ray collector asked for n samples", "an action that is not text")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_broken_invariant_is_not_a_user_error(bug):
    with pytest.raises((ValueError, RuntimeError, TypeError)) as caught:
        BUGS[bug]()
    assert not isinstance(caught.value, UserError), caught.value
    assert isinstance(caught.value, TypeError) == (bug in CONTRACTS), caught.value
