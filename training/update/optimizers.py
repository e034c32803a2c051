"""The policy update's optimiser: AdamW or SGD (`optim.optimizer`).

Why more than AdamW: an RL batch of a few dozen trajectories gives a gradient whose per-weight noise is
large against its signal. AdamW's early steps move every weight by about lr in the sign of its gradient
(m/√v ≈ ±1 when the moments hold one or two gradients), so a weight whose gradient is pure noise moves as
far as one carrying the signal. SGD moves weights in proportion to their gradient, so the update's energy
goes where the gradient is large. docs/learning.md compares them (and a normalised gradient step, which lives
with the studies: benchmarks/studies/normalized_sgd.py) with the shuffled-advantage check
(benchmarks/studies/signal_check.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from trace_gym.errors import ConfigError
from trace_gym.training.config import OPTIMIZERS


def make_optimizer(params: Iterable[Any], name: str, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0) -> torch.optim.Optimizer:
    """The optimiser ``name`` (one of ``OPTIMIZERS``) over ``params``."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ConfigError(f"expected optim.optimizer in {OPTIMIZERS}, got {name!r}; fix: optim.optimizer=adamw")
