"""The verifiers taskset package ``trace_gym_verifiers`` exports the configs beside the classes: Python builds the
env through verifiers' own loader with no internal import, and verifiers still finds one env, one taskset and one
harness among the exports."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers")

import verifiers.v1 as vf
from verifiers.v1.harness import Harness
from verifiers.v1.utils.loaders import environment_class, harness_class, load_environment, taskset_class

import trace_gym_verifiers
from trace_gym_verifiers import TraceGymEnv, TraceGymEnvConfig, TraceGymTasksetConfig


def test_the_env_config_builds_the_env_through_verifiers_loader():
    config = TraceGymEnvConfig(taskset=TraceGymTasksetConfig(id="trace_gym_verifiers", env="trace/Arithmetic-v0",
                                                             env_args={"n_tasks": 3}))
    env = load_environment(config)
    tasks = env.taskset.load()
    assert isinstance(env, TraceGymEnv) and len(tasks) == 3
    assert {t.data.env for t in tasks} == {"trace/Arithmetic-v0"} and tasks[0].data.env_args == {"n_tasks": 3}


def test_verifiers_finds_one_env_taskset_and_harness_among_the_exports():
    exported = [getattr(trace_gym_verifiers, name) for name in trace_gym_verifiers.__all__]
    assert sum(isinstance(c, type) and issubclass(c, vf.EnvConfig) for c in exported) == 1
    assert environment_class("trace_gym_verifiers") is TraceGymEnv
    assert taskset_class("trace_gym_verifiers").__name__ == "TraceGymTaskset"
    assert issubclass(harness_class("trace_gym_verifiers"), Harness)
