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
