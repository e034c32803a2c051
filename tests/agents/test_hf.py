"""The transformers backend: shapes, logprobs, stop conditions, seeds, prefix sharing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.agents.hf import HFPolicy, sequence_logprobs
from trace_gym.agents.policy import Policy, Request, SamplingParams
from trace_gym.errors import ConfigError

MSGS = [{"role": "system", "content": "Use <python>code</python>."}, {"role": "user", "content": "What is 2+3?"}]


def test_generations_come_request_major_with_consistent_shapes(nano_policy):
    reqs = [Request(messages=MSGS), Request(prompt_ids=[5, 6, 7])]
    gens = nano_policy.generate(reqs, SamplingParams(n=3, max_new_tokens=6, min_new_tokens=6, seed=0))
    assert isinstance(nano_policy, Policy)
    assert [(g.request_index, g.sample_index) for g in gens] == [(i, j) for i in range(2) for j in range(3)]
    for g in gens:
        assert len(g.token_ids) == len(g.logprobs) == 6 and g.finish_reason == "length"
        assert g.prompt_tokens == len(g.prompt_ids) and all(lp <= 0 for lp in g.logprobs)
    assert gens[3].prompt_ids == [5, 6, 7]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_a_forward_pass_of_the_same_tokens(nano_policy, temperature):
    reqs = [Request(messages=MSGS), Request(messages=MSGS[1:])]  # different lengths: left padding in play
    sp = SamplingParams(temperature=temperature, top_k=50, max_new_tokens=12, min_new_tokens=12, n=2, seed=3)
    for g in nano_policy.generate(reqs, sp):
        ids = torch.tensor([g.prompt_ids + g.token_ids])
        ref = sequence_logprobs(nano_policy.model, ids, temperature=sp.logprob_temperature)[0]
        torch.testing.assert_close(torch.tensor(g.logprobs), ref[g.prompt_tokens - 1:], atol=1e-4, rtol=0)


def test_greedy_picks_the_argmax_of_a_plain_forward_pass(nano_policy):
    g = nano_policy.generate([Request(messages=MSGS)], SamplingParams(temperature=0, max_new_tokens=8,
                                                                      min_new_tokens=8))[0]
    ids = g.prompt_ids + g.token_ids
    with torch.no_grad():
        logits = nano_policy.model(torch.tensor([ids])).logits[0]
    assert logits[len(g.prompt_ids) - 1:-1].argmax(-1).tolist() == g.token_ids


def test_same_seed_same_samples_and_other_seed_differs(nano_policy):
    sp = SamplingParams(max_new_tokens=10, min_new_tokens=10, n=2, seed=11)
    a = nano_policy.generate([Request(messages=MSGS)], sp)
    b = nano_policy.generate([Request(messages=MSGS)], sp)
    c = nano_policy.generate([Request(messages=MSGS)], SamplingParams(max_new_tokens=10, min_new_tokens=10,
                                                                      n=2, seed=12))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    assert a[0].token_ids != a[1].token_ids


def test_a_rows_sample_does_not_depend_on_its_batch(nano_policy):
    sp = SamplingParams(max_new_tokens=10, min_new_tokens=10, seed=5)
    alone = nano_policy.generate([Request(messages=MSGS)], sp)[0]
    batched = nano_policy.generate([Request(messages=MSGS), Request(prompt_ids=[9] * 30)], sp)[0]
    assert alone.token_ids == batched.token_ids


def test_generation_stops_on_end_of_turn_and_text_drops_it(nano_policy):
    eot = nano_policy.tokenizer.eos_token_id
    gens = nano_policy.generate([Request(messages=MSGS)], SamplingParams(max_new_tokens=64, n=16, seed=0))
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped, "a random nano model emits end-of-turn within 64 tokens for some of 16 samples"
    for g in stopped:
        assert g.token_ids[-1] in nano_policy.stop_ids and eot not in g.token_ids[:-1]
        assert g.text == nano_policy.tokenizer.decode(g.token_ids[:-1], skip_special_tokens=True)


def test_min_new_tokens_suppresses_end_of_turn(nano_policy):
    gens = nano_policy.generate([Request(messages=MSGS)], SamplingParams(max_new_tokens=20, min_new_tokens=20,
                                                                         n=8, seed=0))
    assert all(not set(g.token_ids) & nano_policy.stop_ids for g in gens)


@pytest.mark.parametrize("keep", [True, False])
def test_stop_string_ends_the_turn_and_cuts_the_text(nano_policy, keep):
    # A common single character appears soon in random text; the turn must end right at its first occurrence
    # (no minimum length: a stop string inside the first min_new_tokens tokens does not count, as in vLLM).
    sp = SamplingParams(max_new_tokens=200, min_new_tokens=0, n=8, seed=0, stop=("e", "o"),
                        include_stop_str_in_output=keep)
    gens = nano_policy.generate([Request(messages=MSGS)], sp)
    hits = [g for g in gens if g.finish_reason == "stop" and not set(g.token_ids) & nano_policy.stop_ids]
    assert hits
    for g in hits:
        full = nano_policy.tokenizer.decode(g.token_ids, skip_special_tokens=True)
        before = nano_policy.tokenizer.decode(g.token_ids[:-1], skip_special_tokens=True)
        assert ("e" in full or "o" in full) and "e" not in before and "o" not in before
        assert g.text.endswith(("e", "o")) == keep and full.startswith(g.text)


def test_top_k_one_equals_greedy(nano_policy):
    greedy = nano_policy.generate([Request(messages=MSGS)], SamplingParams(temperature=0, max_new_tokens=8,
                                                                           min_new_tokens=8))[0]
    topk = nano_policy.generate([Request(messages=MSGS)], SamplingParams(top_k=1, max_new_tokens=8,
                                                                         min_new_tokens=8, seed=1))[0]
    assert greedy.token_ids == topk.token_ids


def test_tiny_top_p_equals_greedy(nano_policy):
    greedy = nano_policy.generate([Request(messages=MSGS)], SamplingParams(temperature=0, max_new_tokens=8,
                                                                           min_new_tokens=8))[0]
    nucleus = nano_policy.generate([Request(messages=MSGS)], SamplingParams(top_p=1e-6, max_new_tokens=8,
                                                                            min_new_tokens=8, seed=1))[0]
    assert greedy.token_ids == nucleus.token_ids


@settings(max_examples=8, deadline=None)
@given(k=st.integers(1, 5), prefix_len=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_prefix_shared_branches_equal_uncached_ones(nano_policy, k, prefix_len, seed):
    shared = nano_policy
    plain = HFPolicy(shared.model, shared.tokenizer, share_prefix=False)
    prefix = [(7 * i + seed) % 250 for i in range(prefix_len)]
    reqs = [Request(prompt_ids=prefix)] * k + [Request(messages=MSGS)]
    sp = SamplingParams(max_new_tokens=12, min_new_tokens=4, n=2, seed=seed)
    a, b = shared.generate(reqs, sp), plain.generate(reqs, sp)
    assert shared.stats.prefill_tokens == prefix_len + a[-1].prompt_tokens
    assert plain.stats.prefill_tokens == 2 * (k * prefix_len + a[-1].prompt_tokens)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_batches_larger_than_the_limit_are_split_without_changing_results(nano_policy):
    small = HFPolicy(nano_policy.model, nano_policy.tokenizer, max_batch_size=3)
    sp = SamplingParams(max_new_tokens=6, min_new_tokens=6, n=4, seed=2)
    reqs = [Request(messages=MSGS), Request(prompt_ids=[3, 4])]
    assert [g.token_ids for g in small.generate(reqs, sp)] == [g.token_ids for g in nano_policy.generate(reqs, sp)]


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(n=0), dict(stop="x"),
                                 dict(max_new_tokens=2, min_new_tokens=3)])
def test_invalid_sampling_params_raise_config_errors(bad):
    with pytest.raises(ConfigError):
        SamplingParams(**bad)


def test_request_needs_exactly_one_prompt_form():
    with pytest.raises(ConfigError):
        Request()
    with pytest.raises(ConfigError):
        Request(messages=MSGS, prompt_ids=[1])


@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(2, 12), min_size=2, max_size=4), left=st.booleans())
def test_padded_rows_score_like_unpadded_ones(nano_policy, lengths, left):
    """Right padding takes the mask-free causal path, left padding the masked one: both must give each row's
    real tokens the logprobs of that row scored alone."""
    g = torch.Generator().manual_seed(sum(lengths))
    rows = [torch.randint(3, 200, (n,), generator=g) for n in lengths]
    width = max(lengths)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    att = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[r, span], att[r, span] = row, 1
    with torch.no_grad():
        got = sequence_logprobs(nano_policy.model, ids, att)
        for r, row in enumerate(rows):
            alone = sequence_logprobs(nano_policy.model, row[None])[0]
            span = slice(width - len(row), width - 1) if left else slice(0, len(row) - 1)
            torch.testing.assert_close(got[r, span], alone, atol=1e-4, rtol=0)


def test_a_model_left_in_training_mode_with_checkpointing_samples_as_in_eval_mode(nano_dir):
    # A trainer (TRL's GRPOTrainer) hands over its model in training mode with gradient checkpointing on, where
    # transformers drops the KV cache: sampling must not see that mode, and must give the mode back.
    policy = HFPolicy.from_pretrained(nano_dir)
    sp = SamplingParams(max_new_tokens=12, min_new_tokens=12, n=2, seed=7)
    reference = [g.token_ids for g in policy.generate([Request(messages=MSGS)], sp)]
    policy.model.gradient_checkpointing_enable()
    policy.model.train()
    assert [g.token_ids for g in policy.generate([Request(messages=MSGS)], sp)] == reference
    assert policy.model.training
