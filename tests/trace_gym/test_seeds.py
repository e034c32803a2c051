"""One seed derivation: (seed, *keys) -> independent streams, the same on every call and machine."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from trace_gym.seeds import derive, generator

keys = st.lists(st.integers(min_value=0, max_value=2**40), max_size=3)


@given(st.integers(min_value=0, max_value=2**62), keys)
def test_a_derived_seed_is_a_63_bit_function_of_its_inputs(seed: int, path: list[int]) -> None:
    value = derive(seed, *path)
    assert value == derive(seed, *path) and 0 <= value < 2**63


def test_nearby_keys_give_different_seeds() -> None:
    seeds = {derive(s, i, j) for s in range(4) for i in range(8) for j in range(8)}
    assert len(seeds) == 4 * 8 * 8
    assert derive(0, 1, 2) != derive(0, 2, 1)  # the order of the keys names the stream


def test_a_generator_is_numpy_s_seed_sequence_of_the_same_keys() -> None:
    a, b = generator(7, 3).random(5), np.random.default_rng([7, 3]).random(5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(generator(7, 3).random(5), generator(7, 4).random(5))


def test_negative_seeds_are_taken_modulo_2_64() -> None:
    assert derive(-1, 5) == derive(2**64 - 1, 5)
