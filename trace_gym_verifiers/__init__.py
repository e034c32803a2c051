"""The verifiers taskset id ``trace_gym_verifiers`` (verifiers looks a taskset up as one top-level module):
trace-gym envs in ``vf-eval``. The classes live in `trace_gym.agents.vf_env`."""

from trace_gym.agents.vf_env import TraceGymEnv, TraceGymHarness, TraceGymTask, TraceGymTaskset

__all__ = ["TraceGymEnv", "TraceGymHarness", "TraceGymTask", "TraceGymTaskset"]
