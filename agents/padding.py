"""Rows of different lengths as one (B, T) tensor: the one padding helper of the model code (generation prompts,
SFT batches, policy-update batches, the expert-probability measure)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_rows(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype = torch.long, left: bool = False,
             width: int | None = None) -> torch.Tensor:
    """(len(rows), width) tensor of ``rows`` (width: the longest row's by default), filled with ``value`` on the
    right (positions start at 0 in every row) or, ``left=True``, on the left (every row's last element at
    column -1)."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            if left:
                out[i, width - len(row):] = torch.as_tensor(row, dtype=dtype)
            else:
                out[i, :len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def attention_mask(rows: Sequence[Sequence[object]], left: bool = False) -> torch.Tensor:
    """(len(rows), longest row) long tensor: 1 where a row has an element, 0 on its padding."""
    return pad_rows([[1] * len(r) for r in rows], 0, left=left)
