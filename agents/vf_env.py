"""A trace-gym env as a verifiers environment (verifiers 0.4, ``verifiers.v1``): a taskset of the env's tasks and
a harness that plays each episode with the env in the loop, so that ``vf-eval`` (and prime-rl, which runs the
same env servers) evaluates any trace-gym env, a user's own included, and ``vf-validate`` checks its tasks:

    vf-eval trace_gym_verifiers --env.taskset.env trace/Arithmetic-v0 --env.taskset.env-args '{"n_tasks": 20}' \\
        -n 20 --model MODEL --client.base-url http://127.0.0.1:8000 --no-rich --no-push
    vf-validate trace_gym_verifiers --taskset.env trace/Arithmetic-v0 --taskset.env-args '{"n_tasks": 20}' \\
        -n 20 --runtime.type subprocess --no-rich

(vf-eval nests the taskset under ``--env.``, vf-validate does not: each command's own flags.) verifiers resolves a
taskset id to one importable module that exports the classes (a dotted id is not looked up), hence the two-line
top-level package ``trace_gym_verifiers`` that re-exports this module's.

`TraceGymTaskset` loads the tasks of ``env`` (any env spec) built with ``env_args``; each task's data names the
env and the task id and carries the env's system and user messages as its prompt. `TraceGymHarness` runs in the
rollout's process (no program to install): it starts the task in a fresh env, sends the chat to the model
through the rollout's interception endpoint (so verifiers records every turn, tokens included), steps the env
with each reply and sends the env's answer back, until the episode ends; the env's reward is the task's
``env_reward``. Tool calls are native by default, as in ``trace-gym eval``: the env's tools go as ``tools``, the
model's ``tool_calls`` become the env's actions and a reply without tool calls is the final answer
(agents/native_tools.py); ``--env.agent.harness.id trace_gym_verifiers --env.agent.harness.tool-calls text`` lets
the model write the env's text actions instead. `TraceGymEnv` is the single-agent env with the local runtime as
its default.

vf-validate's checks: gold plays the env's scripted expert (no noise) on the task and is valid when it earns the
full reward (unchecked for an env without an expert); noop scores the task untouched, which is 0 (no answer).

Several envs in one taskset: ``--env.taskset.envs '{"math": {"env": "trace/Arithmetic-v0", "env_args": {...}},
"qa": {...}}'`` loads every env's tasks under the operator's keys (task ids ``math/arith-0``); each task's data
names its env by that key (``env_key``), the harness plays it on that env, and records the reward also as
``trace_gym_reward/<key>``, so a run reports each env apart. The mix's proportions are the envs' task counts.

The operator chooses the env: the harness builds only the envs that a `TraceGymTaskset` of this process loaded
from its config, so task data (which another taskset, a saved trace or a wire message could carry) picks a
task, never the code that runs or the files it reads (a ``module:Class`` spec, a ``data_path``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import BaseModel, Field
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult

from trace_gym.env_mix import KEY, SEP
from trace_gym.errors import ConfigError, ServerError
from trace_gym.integrations.session import EnvSession

__all__ = ["TraceGymEnv", "TraceGymHarness", "TraceGymTask", "TraceGymTaskset"]

REWARD = "trace_gym_reward"
TURNS = "trace_gym_turns"
_LOADED: set[str] = set()
"""The (env, env_args) of every taskset loaded in this process: the envs the operator chose."""
_KEYED: dict[str, str] = {}
"""The operator's env keys of the tasksets loaded in this process (``envs``), each with its (env, env_args)."""


def _choice(env: str, env_args: dict[str, Any]) -> str:
    return json.dumps([env, env_args], sort_keys=True, default=str)


def _session(data: Any) -> EnvSession:
    """A session of the env that ``data`` names, if the operator's taskset chose it (module docstring)."""
    key = getattr(data, "env_key", None)
    if key is not None and _KEYED.get(key) != _choice(data.env, dict(data.env_args)):
        raise ConfigError(f"expected task data naming one of the operator's env keys {sorted(_KEYED)} with that "
                          f"env's own settings, got env_key {str(key)[:80]!r} with env {data.env!r}; fix: choose the "
                          "envs with the taskset's own settings (--env.taskset.envs): task data may pick a task, not "
                          "the env")
    if _choice(data.env, dict(data.env_args)) not in _LOADED:
        raise ConfigError(f"expected task data of a trace_gym_verifiers taskset loaded in this process, got data "
                          f"naming env {data.env!r} with {dict(data.env_args)!r}, which no such taskset loaded; fix: "
                          "choose the env with the taskset's own settings (--env.taskset.env, --env.taskset.env-args)"
                          ": task data may pick a task, not the env")
    return EnvSession(data.env, data.env_args)


class TraceGymData(vf.TaskData):
    env: str
    """The env spec (a registered id, module:id or module:Class)."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """The env's keyword arguments."""
    task_id: str
    """The env task this row plays."""
    env_key: str | None = None
    """The operator's key of the env (a taskset's ``envs``), None for a one-env taskset."""


class TraceGymTask(vf.Task[TraceGymData]):
    @vf.reward
    async def env_reward(self, trace: vf.Trace) -> float:
        """The reward the env gave the episode (recorded by `TraceGymHarness`); 0 for a task nobody played (no
        model call: no answer, which is what an env gives an episode without one, and vf-validate's noop check)."""
        value = trace.metrics.get(REWARD)
        if value is None and not trace.calls:
            return 0.0
        if value is None:
            raise ValueError("expected the episode's env reward on the trace, got none though the model was called; "
                             "fix: play trace-gym tasks with the trace_gym_verifiers harness (its taskset's default)")
        return float(value)

    async def validate(self, runtime: Any) -> bool | None:
        """vf-validate's gold check: the env's scripted expert (no noise) plays the task and earns the full reward;
        None when the env has no expert."""
        return await asyncio.to_thread(_expert_solves, self.data)


def _expert_solves(data: Any) -> bool | None:
    session = _session(data)
    try:
        expert_of = getattr(session.base, "expert", None)
        if expert_of is None:
            return None
        expert = expert_of(noise=0.0, seed=0)
        session.reset(task_id=data.task_id)
        task = session.base.task
        out: dict[str, Any] = {"done": False, "reward": 0.0}
        while not out["done"]:
            out = session.step(expert.act(task, session.messages()))
        return out["reward"] >= 1.0
    finally:
        session.close()


class TraceGymEnvChoice(BaseModel):
    """One env of a taskset's ``envs``."""

    env: str
    """The trace-gym env spec."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Its keyword arguments."""


class TraceGymTasksetConfig(vf.TasksetConfig):
    env: str = "trace/Arithmetic-v0"
    """The trace-gym env spec, ``--env.taskset.env``."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Its keyword arguments, ``--env.taskset.env-args '{"n_tasks": 20}'``."""
    envs: dict[str, TraceGymEnvChoice] = Field(default_factory=dict)
    """Several envs under the operator's keys, in place of ``env`` and ``env_args``: ``--env.taskset.envs
    '{"math": {"env": "trace/Arithmetic-v0", "env_args": {"n_tasks": 20}}, ...}'`` (module docstring)."""


class TraceGymTaskset(vf.Taskset[TraceGymTask, TraceGymTasksetConfig]):
    def load(self) -> list[TraceGymTask]:
        envs = {k: (c.env, dict(c.env_args)) for k, c in self.config.envs.items()}
        defaults = TraceGymTasksetConfig.model_fields
        if envs and (self.config.env != defaults["env"].default or self.config.env_args):
            raise ConfigError("expected the taskset's envs or its env (and env-args), not both; fix: put every env "
                              "under --env.taskset.envs")
        for key in envs:
            if not KEY.match(key):
                raise ConfigError(f"expected env keys of letters, digits, '_', '.' or '-', got {key!r}; fix: a short "
                                  "word such as 'math'")
        out: list[TraceGymTask] = []
        for key, (env, env_args) in (envs or {None: (self.config.env, dict(self.config.env_args))}).items():
            _LOADED.add(_choice(env, env_args))
            if key is not None:
                _KEYED[key] = _choice(env, env_args)
            session = EnvSession(env, env_args)
            try:
                for task in session.base.tasks:
                    messages = session.reset(task_id=task.id)["messages"]
                    system = next((m["content"] for m in messages if m["role"] == "system"), None)
                    user = next(m["content"] for m in messages if m["role"] == "user")
                    data = TraceGymData(idx=len(out), id=task.id if key is None else f"{key}{SEP}{task.id}",
                                        prompt=user, system_prompt=system, env=env, env_args=env_args,
                                        task_id=task.id, env_key=key)
                    out.append(TraceGymTask(data, self.config.task))
            finally:
                session.close()
        return out


class TraceGymHarnessConfig(HarnessConfig):
    tool_calls: Literal["native", "text"] = "native"
    """"native": the env's tools go as ``tools`` and a reply without tool calls is the final answer (the OpenAI
    form; a server with a tool-call parser); "text": the model writes the env's actions."""
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
        if getattr(data, "env_key", None) is not None:  # each env's reward apart, for a taskset of several
            trace.record_metric(f"{REWARD}/{data.env_key}", reward)
        trace.record_metric(TURNS, float(turns))
        return ProgramResult(exit_code=0, stdout="", stderr="")

    def play(self, ctx: Any, endpoint: str, secret: str, data: Any) -> tuple[float, int]:
        """One episode of ``data``'s task through the model at ``endpoint``: (reward, turns)."""
        from trace_gym.agents.native_tools import ToolFormat
        from trace_gym.agents.openai_backend import OpenAIPolicy
        from trace_gym.agents.policy import Request, SamplingParams

        session = _session(data)
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
                gen = policy.generate([Request(messages=messages)], params)[0]
                if gen.error is not None:  # verifiers records the rollout's error; the episode has no reward
                    raise ServerError(gen.error)
                out = session.step(gen.text)
                turns += 1
                reward, done = out["reward"], out["done"]
                messages = session.messages()
            policy.close()
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
