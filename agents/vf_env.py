"""A trace-gym env as a verifiers environment (verifiers 0.4, ``verifiers.v1``): a taskset of the env's tasks and
a harness that plays each episode with the env in the loop, so that ``vf-eval`` (and prime-rl, which runs the
same env servers) evaluates any trace-gym env, a user's own included:

    vf-eval trace_gym_verifiers --env.taskset.env trace/Arithmetic-v0 --env.taskset.env-args '{"n_tasks": 20}' \\
        -n 20 --model MODEL --client.base-url http://127.0.0.1:8000 --no-rich --no-push

verifiers resolves a taskset id to one importable module that exports the classes (a dotted id is not looked
up), hence the two-line top-level package ``trace_gym_verifiers`` that re-exports this module's.

`TraceGymTaskset` loads the tasks of ``env`` (any env spec) built with ``env_args``; each task's data names the
env and the task id and carries the env's system and user messages as its prompt. `TraceGymHarness` runs in the
rollout's process (no program to install): it starts the task in a fresh env, sends the chat to the model
through the rollout's interception endpoint (so verifiers records every turn, tokens included), steps the env
with each reply and sends the env's answer back, until the episode ends; the env's reward is the task's
``env_reward``. Tool calls go as the env's text actions by default (``--env.agent.harness.id trace_gym_verifiers
--env.agent.harness.tool-calls native`` sends the env's tools and maps the model's ``tool_calls``,
agents/native_tools.py). `TraceGymEnv` is the single-agent env with the local runtime as its default.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult

from trace_gym.integrations.session import EnvSession

__all__ = ["TraceGymEnv", "TraceGymHarness", "TraceGymTask", "TraceGymTaskset"]

REWARD = "trace_gym_reward"
TURNS = "trace_gym_turns"


class TraceGymData(vf.TaskData):
    env: str
    """The env spec (a registered id, module:id or module:Class)."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """The env's keyword arguments."""
    task_id: str
    """The env task this row plays."""


class TraceGymTask(vf.Task[TraceGymData]):
    @vf.reward
    async def env_reward(self, trace: vf.Trace) -> float:
        """The reward the env gave the episode (recorded by `TraceGymHarness`)."""
        value = trace.metrics.get(REWARD)
        if value is None:
            raise ValueError("expected the episode's env reward on the trace, got none; fix: play trace-gym tasks "
                             "with the trace_gym_verifiers harness (its taskset's default)")
        return float(value)


class TraceGymTasksetConfig(vf.TasksetConfig):
    env: str = "trace/Arithmetic-v0"
    """The trace-gym env spec, ``--env.taskset.env``."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Its keyword arguments, ``--env.taskset.env-args '{"n_tasks": 20}'``."""


class TraceGymTaskset(vf.Taskset[TraceGymTask, TraceGymTasksetConfig]):
    def load(self) -> list[TraceGymTask]:
        session = EnvSession(self.config.env, self.config.env_args)
        try:
            out = []
            for i, task in enumerate(session.base.tasks):
                messages = session.reset(task_id=task.id)["messages"]
                system = next((m["content"] for m in messages if m["role"] == "system"), None)
                user = next(m["content"] for m in messages if m["role"] == "user")
                data = TraceGymData(idx=i, id=task.id, prompt=user, system_prompt=system, env=self.config.env,
                                    env_args=dict(self.config.env_args), task_id=task.id)
                out.append(TraceGymTask(data, self.config.task))
            return out
        finally:
            session.close()


class TraceGymHarnessConfig(HarnessConfig):
    tool_calls: Literal["text", "native"] = "text"
    """"text": the model writes the env's actions; "native": the env's tools go as ``tools`` (a server with a
    tool-call parser)."""
    max_tokens: int = 256
    """Tokens per turn when the run's sampling sets none."""


class TraceGymHarness(Harness[TraceGymHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False
    EXECUTES_CODE = False  # the model's code runs in the env's own sandbox, not in the rollout's runtime

    async def launch(self, ctx: Any, trace: vf.Trace, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData, **kwargs: Any) -> ProgramResult:
        reward, turns = await asyncio.to_thread(self.play, ctx, endpoint, secret, data)
        trace.record_metric(REWARD, reward)
        trace.record_metric(TURNS, float(turns))
        return ProgramResult(exit_code=0, stdout="", stderr="")

    def play(self, ctx: Any, endpoint: str, secret: str, data: Any) -> tuple[float, int]:
        """One episode of ``data``'s task through the model at ``endpoint``: (reward, turns)."""
        from trace_gym.agents.native_tools import ToolFormat
        from trace_gym.agents.openai_backend import OpenAIPolicy
        from trace_gym.agents.policy import Request, SamplingParams

        session = EnvSession(data.env, data.env_args)
        try:
            messages = session.reset(task_id=data.task_id)["messages"]
            policy = OpenAIPolicy(endpoint, ctx.model, api_key=secret, server="openai",
                                  tool_calls=self.config.tool_calls, tool_format=ToolFormat.of_env(session.env))
            sampling = ctx.sampling
            params = SamplingParams(temperature=1.0 if sampling.temperature is None else float(sampling.temperature),
                                    top_p=1.0 if sampling.top_p is None else float(sampling.top_p),
                                    max_new_tokens=int(sampling.max_tokens or self.config.max_tokens))
            reward, turns, done = 0.0, 0, False
            while not done:
                text = policy.generate([Request(messages=messages)], params)[0].text
                out = session.step(text)
                turns += 1
                reward, done = out["reward"], out["done"]
                messages = session.messages()
            return reward, turns
        finally:
            session.close()


class TraceGymEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The one seat, in the local runtime (the harness runs no program: the env holds the tools); its harness is
    the taskset's, `TraceGymHarness`."""


class TraceGymEnv(vf.Env[TraceGymEnvConfig]):
    """The single-agent env of the taskset, with the harness and the local runtime as defaults."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)
