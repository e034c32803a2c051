"""A study optimiser: a step of fixed length lr along the (momentum) gradient direction, so that the step size
no longer depends on the batch's gradient norm, which varies a lot with how many trained nodes and tokens a
step has. docs/learning.md screens it with the shuffled-advantage check (true minus shuffled within noise of 0
at every step length tried), so the library's ``optim.optimizer`` does not offer it; ``signal_screen.py``
builds it for a setting ``optim.optimizer=normalized_sgd``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class NormalizedSGD(torch.optim.Optimizer):
    """p <- p - lr · d / ||d||, with d the gradient (or its heavy-ball momentum) and ||·|| the global norm over
    every parameter of every group: a step of length lr in parameter space, along the gradient."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ValueError(f"expected lr > 0, 0 <= momentum < 1, weight_decay >= 0, got {lr}, {momentum}, "
                              f"{weight_decay}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        directions = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if group["momentum"]:
                    buf = self.state[p].get("momentum_buffer")
                    buf = d.clone() if buf is None else buf.mul_(group["momentum"]).add_(d)
                    self.state[p]["momentum_buffer"] = buf
                    d = buf
                directions.append((group, p, d))
        if not directions:
            return loss
        sq = sum(_full(torch.linalg.vector_norm(d)) ** 2 for _, _, d in directions)
        norm = float(torch.sqrt(torch.as_tensor(sq)))
        if norm == 0.0 or not torch.isfinite(torch.as_tensor(norm)):
            return loss
        for group, p, d in directions:
            if group["weight_decay"]:
                p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(d, alpha=-group["lr"] / norm)
        return loss


def _full(x: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a DTensor (FSDP2 shards) or the tensor itself."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x
