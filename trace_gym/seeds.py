"""Seeds: every seed and generator derived from a run's seed comes from here.

A run has one seed; each stream that needs its own randomness (a step's allocation, a rollout chunk's
sampling, one sample of one request, an expert's turn) is named by a tuple of non-negative integer keys under
it, and numpy's `SeedSequence` turns (seed, *keys) into independent state. So results do not depend on batch
composition, worker count or the order in which streams are drawn, and nearby keys give unrelated streams.

A generator that is the only stream of the seed it is given seeds itself with it directly: a task set's
(`make_tasks(seed=...)` of the Arithmetic, chain and simulation envs), a scripted expert's noise (each expert
turn already gets its own derived seed), the checker's random actions, the simulation's candidate pools, the
SFT batch order, the update's shuffle and a predictor head's first weights (torch generators). Those streams
are fixed by their seed alone, and the committed task sets and figures depend on them as they are.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def _entropy(seed: int, keys: tuple[int, ...]) -> list[int]:
    return [int(seed) & _MASK64, *(int(k) & _MASK64 for k in keys)]


def derive(seed: int, *keys: int) -> int:
    """A 63-bit seed for the stream ``keys`` under ``seed`` (for backends and envs that take an int seed)."""
    state = np.random.SeedSequence(_entropy(seed, keys)).generate_state(1, np.uint64)
    return int(state[0]) & ((1 << 63) - 1)


def generator(seed: int, *keys: int) -> np.random.Generator:
    """A numpy generator for the stream ``keys`` under ``seed`` (``default_rng([seed, *keys])``)."""
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, keys)))
