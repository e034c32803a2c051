"""The optimizer step of the policy update: one `policy_update` call is one optimiser step over this rank's rows.

Choices:
1. Every rank trains on its own rows; the loss is divided by the trained tokens of the whole step
   (all-reduced) and multiplied by the world size, because DDP and FSDP2 average gradients over ranks. The
   update therefore equals the single-process update on all rows (token-level normalisation, loss.py note 1).
2. Every rank runs the same number of forward/backward passes (the largest local count; missing micro-batches
   are a real row or pack with an all-zero mask): FSDP2 and DDP issue collectives in each pass, so unequal
   counts would hang.
3. A micro-batch is either rows (an `UpdateBatch` of ``micro_batch`` rows) or one `packing.Pack` (a token trie
   of rows, packing.py); both hand `policy_loss` the same per-token terms, so the loss, its normaliser and the
   statistics do not depend on which one ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trace_gym.training.update.batches import MicroBatch, UpdateBatch
from trace_gym.training.update.loss import policy_loss
from trace_gym.training.update.packing import Pack
from trace_gym.training.update.parallel import world


def _all_reduce(value: float, op: Any = None) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return float(t.item())


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")



def _loss_terms(part: MicroBatch, model: nn.Module, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logprobs, old logprobs, advantages, mask, reference logprobs) in `policy_loss`'s layout."""
    logprobs = part.logprobs(model, temperature)
    if isinstance(part, Pack):  # already one column per trained (row, token) pair
        return logprobs, part.old_logprobs.float(), part.advantages.float(), part.loss_mask, part.ref_logprobs
    adv = part.advantages if part.advantages.dim() == 1 else part.advantages[:, 1:]
    ref = None if part.ref_logprobs is None else part.ref_logprobs[:, 1:]
    return logprobs[:, 1:], part.old_logprobs[:, 1:].float(), adv.float(), part.loss_mask[:, 1:], ref


def _local_parts(batch: UpdateBatch | Sequence[Pack], micro_batch: int) -> list[MicroBatch]:
    """This rank's micro-batches: ``micro_batch`` rows at a time, or one pack at a time."""
    if isinstance(batch, UpdateBatch):
        return [batch.rows(slice(i, i + micro_batch)) for i in range(0, len(batch), micro_batch)]
    return list(batch)


def _trained_tokens(part: MicroBatch) -> float:
    return float(part.loss_mask.sum()) if isinstance(part, Pack) else float(part.loss_mask[:, 1:].sum())


def policy_update(model: nn.Module, optimizer: torch.optim.Optimizer, batch: UpdateBatch | Sequence[Pack],
                  micro_batch: int = 8, clip_low: float = 0.2, clip_high: float | None = None, kl_coef: float = 0.0,
                  grad_clip: float = 1.0, temperature: float = 1.0, bf16: bool = False) -> dict[str, float]:
    """One optimiser step on this rank's rows ``batch`` (all of them without a process group): an
    `UpdateBatch` run ``micro_batch`` rows per forward/backward, or packs (packing.py) run one per pass.

    The gradient is that of ``policy_loss`` over the rows of all ranks together, normalised by their trained
    tokens (note 1). ``bf16``: forward under bfloat16 autocast on CUDA (FSDP2 takes ``param_dtype`` instead).
    Returns step statistics averaged over ranks (``loss/...``; ``loss/grad_norm`` before clipping;
    ``loss/tokens``, the trained tokens, and ``loss/forward_tokens``, the tokens run through the model, summed).
    """
    if micro_batch < 1:
        raise ValueError(f"expected micro_batch >= 1, got {micro_batch}")
    if len(batch) == 0:
        raise RuntimeError("expected at least one row on every rank, got 0; fix: give each rank >= 1 row")
    _, world_size = world()
    device = next(p for p in model.parameters()).device
    parts = _local_parts(batch, micro_batch)
    tokens = _all_reduce(sum(_trained_tokens(p) for p in parts))
    if tokens == 0:
        raise RuntimeError("expected trained tokens in the batch, got an all-zero loss_mask")
    steps = int(_all_reduce(float(len(parts)), dist.ReduceOp.MAX if dist.is_initialized() else None))
    parts += [parts[0].without_loss()] * (steps - len(parts))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {"loss/forward_tokens": 0.0}
    for i, part in enumerate(parts):
        part = part.to(device)
        # Reduce gradients only after the last micro-batch (the accumulated gradient).
        last = i == len(parts) - 1
        set_sync, no_sync = getattr(model, "set_requires_gradient_sync", None), getattr(model, "no_sync", None)
        if set_sync is not None:  # FSDP2
            set_sync(last)
        sync = no_sync() if no_sync is not None and not last else contextlib.nullcontext()  # DDP
        with sync, torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
            logprobs, old, adv, mask, ref = _loss_terms(part, model, temperature)
            loss, stats = policy_loss(logprobs, old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                                      ref_logprobs=ref, kl_coef=kl_coef, num_tokens=tokens)
            (loss * world_size).backward()
        totals["loss/forward_tokens"] += part.tokens
        weight = stats["loss/tokens"]
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + (value if key in ("loss/total", "loss/tokens") else value * weight)
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # FSDP2 returns a DTensor
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = {key: _all_reduce(value) for key, value in totals.items()}
    for key in out:
        if key not in ("loss/total", "loss/tokens", "loss/forward_tokens"):
            out[key] /= max(out["loss/tokens"], 1.0)
    out["loss/grad_norm"] = float(norm)
    return out

