import math

import pytest
import torch

from trace_gym.training.update.loss import policy_loss


def test_on_policy_loss_is_minus_token_mean_advantage():
    # Two sequences, 3 and 1 trained tokens: token-level mean of (1, 1, 1, -2) = 0.25.
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, stats = policy_loss(lp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask)
    assert loss.item() == pytest.approx(-0.25)
    assert stats["loss/tokens"] == 4


def test_masked_tokens_get_no_gradient():
    lp = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0]])
    loss, _ = policy_loss(lp, lp.detach() + 0.05, torch.randn(2, 4), mask)
    loss.backward()
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.all(lp.grad[mask == 1] != 0)


def test_ratio_beyond_clip_is_clipped_and_has_no_gradient():
    # ratio = e^0.5 ≈ 1.65 > 1.2 with A = 1: the surrogate is -1.2 and constant in θ.
    lp = torch.full((1, 1), 0.5, requires_grad=True)
    loss, stats = policy_loss(lp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), clip_low=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2)
    assert lp.grad.item() == 0.0
    assert stats["loss/clip_frac"] == 1.0


def test_negative_advantage_is_not_clipped_when_ratio_grows():
    # A < 0 and ratio > 1 + eps: min picks the unclipped term (pessimistic), gradient flows.
    lp = torch.full((1, 1), 0.5, requires_grad=True)
    loss, stats = policy_loss(lp, torch.zeros(1, 1), -torch.ones(1), torch.ones(1, 1))
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(0.5))
    assert lp.grad.item() == pytest.approx(math.exp(0.5))
    assert stats["loss/clip_frac"] == 0.0


def test_matches_elementwise_reference():
    torch.manual_seed(0)
    lp, old, ref = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)
    adv = torch.randn(3, 5)
    mask = (torch.rand(3, 5) > 0.3).long()
    loss, _ = policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, ref_logprobs=ref, kl_coef=0.1)
    total, n = 0.0, 0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                r = math.exp(lp[b, t] - old[b, t])
                a = float(adv[b, t])
                surr = min(r * a, min(max(r, 0.8), 1.28) * a)
                d = float(ref[b, t] - lp[b, t])
                total += -surr + 0.1 * (math.exp(d) - d - 1)
                n += 1
    assert loss.item() == pytest.approx(total / n, rel=1e-5)


def test_k3_kl_is_zero_at_reference_and_positive_elsewhere():
    lp = torch.randn(2, 3)
    _, same = policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), ref_logprobs=lp, kl_coef=1.0)
    _, other = policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), ref_logprobs=lp + 0.3, kl_coef=1.0)
    assert same["loss/kl_ref"] == pytest.approx(0.0)
    assert other["loss/kl_ref"] == pytest.approx(math.exp(0.3) - 0.3 - 1, rel=1e-5)


def test_num_tokens_sets_the_normaliser_for_accumulation():
    lp = torch.zeros(1, 2)
    loss, _ = policy_loss(lp, lp, torch.ones(1), torch.ones(1, 2), num_tokens=8)
    assert loss.item() == pytest.approx(-2 / 8)


def test_kl_coef_without_reference_raises():
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), kl_coef=0.1)
