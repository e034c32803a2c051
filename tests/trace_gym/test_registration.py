import subprocess
import sys

import gymnasium as gym
import pytest

import trace_gym
from trace_gym.checker import check_trace_env
from trace_gym.registration import ENV_SPECS


def fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_register_envs_idiom_in_a_fresh_interpreter():
    code = ("import gymnasium as gym, trace_gym\ngym.register_envs(trace_gym)\n"
            "env = gym.make('trace/HotpotQA-v0')\nobs, info = env.reset(seed=0)\nassert obs and info['task_id']\n")
    result = fresh(code)
    assert result.returncode == 0, result.stderr[-2000:]


def test_module_prefix_idiom_in_a_fresh_interpreter():
    code = ("import gymnasium as gym, sys\nassert 'trace_gym' not in sys.modules\n"
            "env = gym.make('trace_gym:trace/HotpotQA-v0')\nassert env.reset(seed=0)[0]\n")
    result = fresh(code)
    assert result.returncode == 0, result.stderr[-2000:]


def test_import_is_cheap_and_loads_no_env_module():
    code = ("import sys, trace_gym\nheavy = [m for m in ('torch', 'transformers', 'bm25s', "
            "'trace_gym.environments.qa.env')"
            " if m in sys.modules]\nassert not heavy, heavy\n")
    result = fresh(code)
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_id_is_in_the_trace_namespace():
    assert all(env_id.startswith("trace/") for env_id in ENV_SPECS)
    assert set(trace_gym.trace_env_ids()) <= set(gym.registry)


@pytest.mark.parametrize("env_id", sorted(ENV_SPECS))
def test_conformance(env_id):
    check_trace_env(env_id)
