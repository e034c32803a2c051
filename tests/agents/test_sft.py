"""Supervised fine-tuning: assistant-only loss, loss falls, held-out success rises above the untrained model's.

The expert episodes and the held-out evaluation come from trace_gym.training (the rollout collector)."""

from __future__ import annotations

import pytest
import torch

from tests.agents.calc_env import CalcEnv
from trace_gym.agents.hf import HFPolicy
from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.sft import SFTSettings, masked_lm_loss, sft, to_sequences
from trace_gym.agents.tiny import build_tiny_model
from trace_gym.training.driver.warm_start import collect_expert_episodes, held_out_eval


@pytest.fixture(scope="module")
def calc_data():
    return collect_expert_episodes(lambda: CalcEnv("train", digits=1), 200)


def test_loss_counts_only_assistant_targets(nano_policy, calc_data):
    tok, model = nano_policy.tokenizer, nano_policy.model
    (ids, mask), = to_sequences(tok, calc_data[:1], max_length=4096)
    t = torch.tensor([ids])
    with torch.no_grad():
        loss = masked_lm_loss(model, t, torch.tensor([mask]), torch.ones_like(t))
        logp = torch.log_softmax(model(t).logits[0].float(), -1)
    by_hand = [-logp[i - 1, ids[i]] for i in range(1, len(ids)) if mask[i]]
    assert sum(mask) == len(by_hand) > 0
    torch.testing.assert_close(loss, torch.stack(by_hand).mean(), atol=1e-5, rtol=0)


def test_sft_loss_falls(tmp_path, calc_data):
    model_dir = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    result = sft(model_dir, calc_data, tmp_path / "out", SFTSettings(steps=30, batch_size=8, warmup_steps=5),
                 progress=False)
    assert len(result.losses) == 30 and (tmp_path / "out" / "model.safetensors").is_file()
    assert sum(result.losses[-5:]) / 5 < 0.6 * result.losses[0]


@pytest.mark.slow
def test_sft_raises_held_out_success_above_the_untrained_model(tmp_path, calc_data):
    greedy = SamplingParams(temperature=0, max_new_tokens=16)

    def held_out():
        return CalcEnv("test", n=40, digits=1)

    model_dir = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    before = held_out_eval(HFPolicy.from_pretrained(model_dir), held_out, n=40, sampling=greedy).success
    sft(model_dir, calc_data, tmp_path / "out", SFTSettings(steps=300, batch_size=16, lr=3e-3, warmup_steps=10),
        progress=False)
    after = held_out_eval(HFPolicy.from_pretrained(tmp_path / "out"), held_out, n=40, sampling=greedy).success
    assert after > before and after >= 0.2


def _padded_batch(tok, calc_data, rows: int):
    from trace_gym.agents.sft import _batch

    return _batch(to_sequences(tok, calc_data[:rows], max_length=4096), tok.pad_token_id)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_loss_and_gradients_equal_the_whole_vocabulary_ones(nano_dir, calc_data, chunk):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(nano_dir)
    ids, mask, att = _padded_batch(tok, calc_data, 4)  # rows of different lengths: right padding in play
    grads = []
    for c in (0, chunk):
        model = AutoModelForCausalLM.from_pretrained(nano_dir, dtype=torch.float32)
        loss = masked_lm_loss(model, ids, mask, att, chunk=c)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (full, full_grads), (chunked, chunked_grads) = grads
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    for a, b in zip(chunked_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_unset_lr_and_batch_size_follow_the_model_size():
    small, large = SFTSettings().resolved(800_000), SFTSettings().resolved(135_000_000)
    assert (small.lr, small.batch_size) == (2e-3, 32) and (large.lr, large.batch_size) == (5e-5, 8)
    assert SFTSettings(lora_r=16).resolved(135_000_000).lr == 5e-4
    assert (SFTSettings(lr=1e-3, batch_size=4).resolved(135_000_000)
            == SFTSettings(lr=1e-3, batch_size=4, processes=1))


def test_lora_sft_trains_the_adapter_and_saves_a_plain_merged_model(tmp_path, calc_data):
    from transformers import AutoModelForCausalLM

    model_dir = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    result = sft(model_dir, calc_data, tmp_path / "out", SFTSettings(steps=20, batch_size=8, lr=1e-2, warmup_steps=2,
                                                                     lora_r=4, lora_alpha=8), progress=False)
    assert sum(result.losses[-3:]) / 3 < result.losses[0]
    assert not list((tmp_path / "out").glob("adapter_*"))  # merged: no adapter files to load
    before = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(any(t in k for t in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj")) for k in changed)  # only what LoRA wraps
