"""The rows a policy update runs: `UpdateBatch` (right-padded rows with per-token targets), built from a step's
`Sample`s by `update_batch`, and `MicroBatch`, what one forward/backward takes (rows, or a packed trie of rows).

Per-token tensors of an `UpdateBatch` are aligned with ``input_ids``: position t holds the log-probability of
token t (computed from the logits at t - 1); position 0 is never trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from trace_gym.agents.hf import sequence_logprobs
from trace_gym.agents.padding import attention_mask, pad_rows
from trace_gym.training.update.packing import Pack
from trace_gym.training.update.samples import Sample


@dataclass(frozen=True)
class UpdateBatch:
    """Rows of token ids with per-token training targets, all (B, T) and aligned with ``input_ids``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # 1 on sampled action tokens
    old_logprobs: torch.Tensor  # behaviour log-probs of token t at position t
    advantages: torch.Tensor  # (B,) one per row, or (B, T)
    ref_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        for name in ("attention_mask", "loss_mask", "old_logprobs"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"expected {name} of shape {shape} (like input_ids), "
                                  f"got {tuple(getattr(self, name).shape)}")
        if self.advantages.shape[0] != shape[0]:
            raise ValueError(f"expected advantages with {shape[0]} rows, got {tuple(self.advantages.shape)}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, index: torch.Tensor | slice | Sequence[int]) -> UpdateBatch:
        """The sub-batch of the given rows."""
        if not isinstance(index, slice | torch.Tensor):
            index = torch.as_tensor(list(index), dtype=torch.long)
        rows: dict[str, Any] = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[index])
                                for f in fields(self)}
        return UpdateBatch(**rows)

    def to(self, device: torch.device | str) -> UpdateBatch:
        moved: dict[str, Any] = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
                                 for f in fields(self)}
        return UpdateBatch(**moved)

    def shard(self, rank: int, world_size: int) -> UpdateBatch:
        """Rows ``rank, rank + world_size, ...``: round-robin keeps long and short rows spread over ranks."""
        return self.rows(slice(rank, None, world_size))

    @property
    def tokens(self) -> int:
        """Tokens run through the model by a forward over these rows (padding included)."""
        return int(self.input_ids.numel())

    def without_loss(self) -> UpdateBatch:
        """The first row with nothing trained (an idle rank's pass, optimizer_step.py note 2)."""
        part = self.rows(slice(0, 1))
        return replace(part, loss_mask=torch.zeros_like(part.loss_mask))

    def with_reference(self, ref_logprobs: torch.Tensor) -> UpdateBatch:
        return replace(self, ref_logprobs=ref_logprobs)

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """(B, T) log-probabilities of the tokens under ``model``, aligned with ``input_ids``."""
        return token_logprobs(model, self.input_ids, self.attention_mask, temperature)



def update_batch(samples: Sequence[Sample], pad_id: int) -> UpdateBatch:
    """Right-padded rows (context + action); the loss mask and behaviour logprobs sit on the action tokens."""
    rows = [s.context + s.action for s in samples]
    mask = pad_rows([[0.0] * len(s.context) + [1.0] * len(s.action) for s in samples], 0.0, torch.float32)
    old = pad_rows([[0.0] * len(s.context) + list(s.logprobs) for s in samples], 0.0, torch.float32)
    return UpdateBatch(pad_rows(rows, pad_id), attention_mask(rows), mask, old,
                       torch.tensor([s.advantage for s in samples]))


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """(B, T) log-probability of token t at position t (`sequence_logprobs` aligned with ``input_ids``);
    column 0 is zero. Positions count real tokens only, so left padding is harmless."""
    taken = sequence_logprobs(model, input_ids, attention_mask, temperature)
    return torch.cat([torch.zeros_like(taken[:, :1]), taken], dim=1)



MicroBatch = UpdateBatch | Pack
"""What one forward/backward runs: rows or a packed trie of rows (optimizer_step.py note 3)."""
