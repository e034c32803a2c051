"""A gymnasium space of Unicode strings.

``gymnasium.spaces.Text`` enumerates its charset, so a full-Unicode charset costs seconds to build and tens of
megabytes to pickle; LLM observations and actions are arbitrary text, so this space checks type and length only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789<>/{}[]\":,.'()=+-*\nßéø漢字"


class String(spaces.Space[str]):
    """Any ``str`` of at most ``max_length`` characters."""

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        if max_length < 1:
            raise ValueError(f"expected max_length >= 1, got {max_length}")
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string over a small mixed alphabet (tags, punctuation, non-ASCII) of length 0..64."""
        length = int(self.np_random.integers(0, min(64, self.max_length) + 1))
        chars = self.np_random.choice(list(_SAMPLE_ALPHABET), size=length)
        return "".join(chars)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"String(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, String) and other.max_length == self.max_length

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[Any]) -> list[str]:
        return [str(s) for s in sample_n]
