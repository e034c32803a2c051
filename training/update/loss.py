"""Clipped policy-gradient loss for tree rollouts (PPO/GRPO surrogate, token-level normalisation).

Deviations and choices where the paper is silent:
1. Token-level normalisation (DAPO style): the summed per-token loss is divided by the number of trained
   tokens, not averaged per sequence first, so long actions are not down-weighted. For gradient
   accumulation, pass ``num_tokens`` = the trained tokens of the whole optimiser step.
2. Asymmetric clipping is allowed (``clip_high``, default = ``clip_low``), as in DAPO's clip-higher.
3. KL to the reference uses the k3 estimator exp(ref - new) - (ref - new) - 1 (unbiased, non-negative),
   added to the loss with weight ``kl_coef``; no KL term when ``ref_logprobs`` is None.
"""

from __future__ import annotations

import torch


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate over the masked tokens.

    logprobs: (B, T) log π_θ of the taken tokens (with grad); old_logprobs: (B, T) behaviour log-probs;
    advantages: (B, T) per token or (B,) per sequence (a node's action gets one advantage); mask: (B, T),
    1 on action tokens, 0 on prompt, observation and padding tokens. Returns (loss, stats).
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"expected logprobs, old_logprobs and mask of one (B, T) shape, got "
                          f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(mask.shape)}")
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    if advantages.shape != logprobs.shape:
        raise ValueError(f"expected advantages of shape (B,) or {tuple(logprobs.shape)}, "
                          f"got {tuple(advantages.shape)}")
    if ref_logprobs is None and kl_coef != 0.0:
        raise ValueError("expected ref_logprobs when kl_coef != 0, got None; fix: pass reference log-probs "
                          "or set kl_coef = 0")
    clip_high = clip_low if clip_high is None else clip_high
    mask = mask.to(logprobs.dtype)
    denom = float(num_tokens) if num_tokens is not None else float(mask.sum().clamp_min(1.0))
    advantages = advantages.to(logprobs.dtype)

    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    kl_ref = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        d = ref_logprobs.detach() - logprobs
        kl_ref = torch.exp(d) - d - 1.0
        per_token = per_token + kl_coef * kl_ref
    loss = (per_token * mask).sum() / denom

    with torch.no_grad():
        n = mask.sum().clamp_min(1.0)
        was_clipped = (clipped < unclipped).to(mask.dtype)  # the clipped branch is the one taken
        stats = {
            "loss/total": loss.item(),
            "loss/clip_frac": float((was_clipped * mask).sum() / n),
            "loss/ratio_mean": float((ratio * mask).sum() / n),
            "loss/approx_kl_behaviour": float(((ratio - 1.0 - log_ratio) * mask).sum() / n),
            "loss/kl_ref": float((kl_ref * mask).sum() / n),
            "loss/tokens": float(mask.sum()),
        }
    return loss, stats
