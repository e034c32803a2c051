"""The update benchmark's trees are what it says: the scripted expert reads the chat back from the rendered
prompt exactly, and plays real multi-turn trees through the token-recording collector."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import trace_gym  # noqa: F401 - registers the trace/* ids
from trace_gym.agents.chat import Conversation

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "update.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("update_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_gym.agents.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), size="nano", seed=0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def test_the_chat_is_read_back_from_the_rendered_prompt(bench, tiny):
    _, tokenizer = tiny
    env = gym.make("trace/Arithmetic-v0", n_tasks=4)
    _, info = env.reset(seed=0)
    conv = Conversation.start(tokenizer, info["messages"])
    action = env.unwrapped.expert().act(env.unwrapped.task, info["messages"])
    _, _, _, _, info = env.step(action)
    conv.add_action(tokenizer.encode(action), action, None)
    conv.add_observation(info["messages"][len(info["messages"]) - 1:])
    got = bench.chat_messages(tokenizer.decode(conv.ids, skip_special_tokens=False))
    env.close()
    assert [m["role"] for m in got] == [m["role"] for m in info["messages"]]
    assert got[-1]["content"] == info["messages"][-1]["content"]  # the tool output the expert answers from


def test_the_expert_plays_multi_turn_trees_with_successes(bench, tiny):
    model, tokenizer = tiny
    spec = {**bench.SETS["hotpotqa"], "prompts": 2, "roots": 2, "continuations": 2}
    trees = bench.collect(spec, model, tokenizer)
    leaves = [n for t in trees for n in t.nodes if n.is_terminal]
    assert len(trees) == 2 and max(n.depth for t in trees for n in t.nodes) >= 3
    assert any(n.reward > 0 for n in leaves)
    assert all(n.token_ids and len(n.logprobs) == len(n.token_ids) for t in trees for n in t.nodes if n.depth)
