import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.errors import ConfigError
from trace_gym.training.allocation.solvers import (
    prefix_utility,
    root_utility,
    solve_prefixes,
    solve_roots,
)

probs = st.floats(0.0, 1.0, allow_nan=False)


def test_root_utility_hand_values():
    # v = 0.5, m = 2: 1 - 1/4 - 1/4; m = 3: 1 - 1/8 - 1/8; v = 0.1, m = 2: 1 - 0.01 - 0.81
    assert root_utility(0.5, 2) == pytest.approx(0.5)
    assert root_utility(0.5, 3) == pytest.approx(0.75)
    assert root_utility(0.1, 2) == pytest.approx(0.18)
    assert root_utility(0.3, 1) == pytest.approx(0.0)
    assert root_utility(0.3, 0) == 0.0
    assert root_utility(1.0, 5) == 0.0


def test_prefix_utility_hand_values():
    # r = 1, v = 0.8: q = 0.8, k = 2 -> 1 - 0.64; r = 0, v = 0.8: q = 0.2 -> 1 - 0.04
    assert prefix_utility(1.0, 0.8, 2) == pytest.approx(0.36)
    assert prefix_utility(0.0, 0.8, 2) == pytest.approx(0.96)
    assert prefix_utility(0.0, 0.8, 0) == pytest.approx(0.0)


def test_solve_roots_hand_case():
    # Budget 4 over v = (0.5, 0.01, 0.5): two pairs on the 0.5 prompts (0.5 + 0.5) beat four on one (0.875).
    assert solve_roots(np.array([0.5, 0.01, 0.5]), 4, cap=4).tolist() == [2, 0, 2]
    # Odd budget 5: one prompt takes 3 (0.75 + 0.5 = 1.25).
    assert sorted(solve_roots(np.array([0.5, 0.01, 0.5]), 5, cap=4).tolist()) == [0, 2, 3]


def _brute_roots(v, budget, cap):
    best = -np.inf
    for ms in itertools.product([0, *range(2, cap + 1)], repeat=len(v)):
        if sum(ms) == budget:
            best = max(best, float(np.sum(root_utility(v, np.array(ms)))))
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(probs, min_size=1, max_size=4), st.integers(0, 12), st.integers(2, 5))
def test_solve_roots_matches_brute_force(v, budget, cap):
    v = np.array(v)
    best = _brute_roots(v, budget, cap)
    if not np.isfinite(best):
        with pytest.raises(ConfigError):
            solve_roots(v, budget, cap)
        return
    m = solve_roots(v, budget, cap)
    assert m.sum() == budget
    assert all(x == 0 or 2 <= x <= cap for x in m)
    assert float(np.sum(root_utility(v, m))) == pytest.approx(best, abs=1e-9)


def test_solve_roots_rejects_budget_one_with_fix():
    with pytest.raises(ConfigError, match="fix"):
        solve_roots(np.array([0.5, 0.5]), 1, cap=4)


def test_solve_roots_skips_certain_prompts():
    m = solve_roots(np.array([0.0, 1.0, 0.4, 0.6, 1.0]), 8, cap=8)
    assert m[0] == m[1] == m[4] == 0


def _brute_prefixes(r, v, budget):
    best = -np.inf
    for ks in itertools.product(range(budget + 1), repeat=len(r)):
        if sum(ks) == budget:
            best = max(best, float(np.sum(prefix_utility(r, v, np.array(ks)))))
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0]), probs), min_size=1, max_size=4), st.integers(0, 6))
def test_solve_prefixes_matches_brute_force(pairs, budget):
    r = np.array([p[0] for p in pairs])
    v = np.array([p[1] for p in pairs])
    k = solve_prefixes(r, v, budget)
    assert k.sum() == budget
    assert float(np.sum(prefix_utility(r, v, k))) == pytest.approx(_brute_prefixes(r, v, budget), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0]), probs, st.floats(0.0, 3.0)), min_size=1, max_size=4),
       st.integers(0, 6))
def test_scaled_solve_prefixes_matches_brute_force_and_a_scale_of_one_changes_nothing(triples, budget):
    r, v, s = (np.array([t[i] for t in triples]) for i in range(3))
    k = solve_prefixes(r, v, budget, s)
    assert k.sum() == budget
    best = max(float(np.sum(s * prefix_utility(r, v, np.array(ks))))
               for ks in itertools.product(range(budget + 1), repeat=len(r)) if sum(ks) == budget)
    assert float(np.sum(s * prefix_utility(r, v, k))) == pytest.approx(best, abs=1e-9)
    assert solve_prefixes(r, v, budget, np.ones(len(r))).tolist() == solve_prefixes(r, v, budget).tolist()


def test_solve_prefixes_prefers_surprising_prefixes():
    # A success whose prefix was predicted to fail (v = 0.1) is where continuations most likely differ.
    k = solve_prefixes(np.array([1.0, 1.0, 0.0]), np.array([0.95, 0.1, 0.05]), 3)
    assert k.argmax() == 1


def test_solve_prefixes_without_prefixes_raises():
    with pytest.raises(ConfigError):
        solve_prefixes(np.array([]), np.array([]), 2)


@pytest.mark.parametrize("values", [[0.5, float("nan")], [1.2, 0.5], [[0.5, 0.5]]])
def test_a_predictor_breaking_its_contract_is_a_bug_not_a_user_error(values):
    with pytest.raises(ValueError) as info:
        solve_roots(np.array(values), 4, cap=4)
    assert not isinstance(info.value, ConfigError)
