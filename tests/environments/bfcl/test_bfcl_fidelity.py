"""The env's reward is BFCL's verdict: ground truth passes on all 800 multi-turn entries, corrupted ground truth
fails, and on a sample the env agrees with bfcl_eval's own multi_turn_checker for the same decoded calls."""

from __future__ import annotations

import importlib
import uuid

import numpy as np
import pytest

from trace_gym.environments.bfcl.calls import decode, to_python_call
from trace_gym.environments.bfcl.data import MULTI_TURN_CATEGORIES, SINGLE_TURN_CATEGORIES
from trace_gym.environments.bfcl.env import BFCLMultiTurnEnv, BFCLSingleTurnEnv
from trace_gym.environments.bfcl.expert import BFCLExpert


def play(env, task, expert, extra=None):
    """Run the expert on `task`; returns (reward, decoded calls per turn per step, as BFCL's checker takes)."""
    _, info = env.reset(options={"task": task})
    decoded: list[list[list[str]]] = [[]]
    done = False
    while not done:
        action = expert.act(task, info["messages"])
        if extra is not None and decode(action).calls:
            action = action[:-1] + ", " + extra + "]"
        calls = [to_python_call(c) for c in decode(action).calls]
        if calls:
            decoded[-1].append(calls)
        _, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        if not done and decode(action).format == "none":
            decoded.append([])
    return reward, decoded


def official_verdict(task, decoded) -> bool:
    """bfcl_eval's multi_turn_checker on the same decoded calls (it evals them: only our repr'd literals)."""
    utils = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    checker = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    model = f"tracegymtest{uuid.uuid4().hex}"
    entry = {"id": task.id, "initial_config": task.meta["initial_config"],
             "involved_classes": task.meta["involved_classes"]}
    try:
        return checker.multi_turn_checker(decoded, task.answer, entry, task.meta["category"], model)["valid"]
    finally:  # its instance cache lives in module globals
        for key in [k for k in vars(utils) if k.startswith(model)]:
            del vars(utils)[key]


@pytest.mark.parametrize("category", MULTI_TURN_CATEGORIES)
def test_ground_truth_scores_one_on_every_entry(category):
    env = BFCLMultiTurnEnv(category, split="all")
    expert = BFCLExpert(noise=0.0)
    rewards = [play(env, task, expert)[0] for task in env.tasks]
    assert len(rewards) == 200 and rewards == [1.0] * 200


@pytest.mark.parametrize("corruption", ["drop", "perturb"])
def test_corrupted_ground_truth_scores_zero_on_every_entry(corruption):
    for category in MULTI_TURN_CATEGORIES:
        env = BFCLMultiTurnEnv(category, split="all")
        expert = BFCLExpert(noise=1.0, seed=3, corruptions=(corruption,))
        failures = [task.id for task in env.tasks if play(env, task, expert)[0] != 0.0]
        assert failures == [], f"{category}: corrupted ground truth still passes on {failures}"


def test_hermes_ground_truth_scores_one():
    env = BFCLMultiTurnEnv("multi_turn_miss_param", split="test")
    expert = BFCLExpert(noise=0.0, style="hermes")
    assert [play(env, task, expert)[0] for task in env.tasks] == [1.0] * len(env.tasks)


@pytest.mark.parametrize("category", MULTI_TURN_CATEGORIES)
def test_env_verdict_equals_official_checker_on_a_sample(category):
    env = BFCLMultiTurnEnv(category, split="all")
    rng = np.random.default_rng(0)
    sample = [env.tasks[int(i)] for i in rng.choice(len(env.tasks), size=12, replace=False)]
    seen = set()
    for task in sample:
        for noise, corruptions, extra in [(0.0, ("drop",), None), (1.0, ("perturb",), None),
                                          (1.0, ("drop",), None), (1.0, ("reorder",), None),
                                          (0.5, ("drop", "perturb", "reorder"), None),
                                          (0.0, ("drop",), "no_such_function(x=1)")]:
            reward, decoded = play(env, task, BFCLExpert(noise, seed=7, corruptions=corruptions), extra)
            assert reward == float(official_verdict(task, decoded)), (task.id, corruptions, decoded)
            seen.add(reward)
    assert seen == {0.0, 1.0}


@pytest.mark.parametrize("category", SINGLE_TURN_CATEGORIES)
def test_single_turn_expert_passes_bfcl_ast_checker_and_noise_fails_it(category):
    env = BFCLSingleTurnEnv(category)
    clean, noisy = BFCLExpert(0.0), BFCLExpert(1.0, seed=1, corruptions=("perturb",))
    rewards = []
    for task in env.tasks:
        env.reset(options={"task": task})
        rewards.append(env.step(clean.act(task, []))[1])
    assert rewards == [1.0] * len(env.tasks)
    if category != "irrelevance":
        wrong = []
        for task in env.tasks[:50]:
            env.reset(options={"task": task})
            wrong.append(env.step(noisy.act(task, []))[1])
        assert sum(wrong) == 0.0
