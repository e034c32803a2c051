"""A nano model that plays a few Arithmetic tasks both ways: with the env's tag actions when the prompt lists no
tools (the text form), and the OpenAI way when the prompt lists the env's tools (what a server with a tool-call
parser reads): the env's native system message, Hermes tool calls as the chat template renders them, and the
final answer as a plain reply. Fine-tuned here on the scripted expert's episodes of those tasks, so that the
served comparison of the two forms plays real tool calls, not an untrained model's noise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENV_ID = "trace/Arithmetic-v0"
ENV_ARGS = {"n_tasks": 2, "max_turns": 3}


def native_call(code: str) -> str:
    """A python call as the tiny model's chat template renders an assistant ``tool_calls`` entry."""
    return '<tool_call>\n{"name": "python", "arguments": ' + json.dumps({"code": code}) + "}\n</tool_call>"


def expert_episodes() -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]], str]:
    """The expert's episode of every task (env messages), the env's tool schemas and its native system message."""
    from trace_gym.env_specs import env_factory

    env = env_factory(ENV_ID, ENV_ARGS)()
    expert = env.unwrapped.expert(noise=0.0, seed=0)
    episodes = []
    try:
        for i in range(ENV_ARGS["n_tasks"]):
            _, info = env.reset(options={"index": i})
            done = False
            while not done:
                action = expert.act(env.unwrapped.task, info["messages"])
                _, _, terminated, truncated, info = env.step(action)
                done = terminated or truncated
            episodes.append(info["messages"])
        schemas = [t.schema() for t in env.unwrapped.tool_map.values()]
        native_system = env.unwrapped.native_system_message()
    finally:
        env.close()
    return episodes, schemas, native_system


def build_tool_model(base: Path, out: Path, steps: int = 300) -> Path:
    """Fine-tune the model in ``base`` on both forms of the expert's episodes; saved to ``out``."""
    from transformers import AutoTokenizer

    from trace_gym.agents.chat import tokenize_episode
    from trace_gym.agents.sft import SFTSettings, sft

    episodes, schemas, native_system = expert_episodes()
    tokenizer = AutoTokenizer.from_pretrained(base)
    convs = []
    for messages in episodes:
        convs.append(tokenize_episode(tokenizer, messages))
        native = [dict(m) for m in messages]
        for m in native:
            if m["role"] == "system":
                m["content"] = native_system
            elif m["role"] == "assistant" and m["content"].startswith("<python>"):
                m["content"] = native_call(m["content"].removeprefix("<python>").removesuffix("</python>"))
            elif m["role"] == "assistant" and m["content"].startswith("<answer>"):
                m["content"] = m["content"].removeprefix("<answer>").removesuffix("</answer>")
        convs.append(tokenize_episode(tokenizer, native, tools=schemas))
    sft(base, convs, out, SFTSettings(steps=steps, batch_size=4, lr=3e-3, warmup_steps=10), progress=False)
    return out
