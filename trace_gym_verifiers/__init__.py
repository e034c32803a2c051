"""The verifiers taskset id ``trace_gym_verifiers`` (verifiers looks a taskset up as one top-level module):
trace-gym envs in ``vf-eval``. The classes live in `trace_gym.agents.vf_env`; the configs are exported too, so
that Python builds the env without an internal import:

    from verifiers.v1.utils.loaders import load_environment
    from trace_gym_verifiers import TraceGymEnvConfig, TraceGymTasksetConfig

    env = load_environment(TraceGymEnvConfig(taskset=TraceGymTasksetConfig(
        id="trace_gym_verifiers", env="trace/Arithmetic-v0", env_args={"n_tasks": 20})))
"""

from trace_gym.agents.vf_env import (
    TraceGymData,
    TraceGymEnv,
    TraceGymEnvConfig,
    TraceGymHarness,
    TraceGymHarnessConfig,
    TraceGymTask,
    TraceGymTaskset,
    TraceGymTasksetConfig,
)

__all__ = ["TraceGymData", "TraceGymEnv", "TraceGymEnvConfig", "TraceGymHarness", "TraceGymHarnessConfig",
           "TraceGymTask", "TraceGymTaskset", "TraceGymTasksetConfig"]
