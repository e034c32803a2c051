import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.errors import ConfigError
from trace_gym.training.allocators import ALLOCATORS, StepBudget, expand_counts, make_allocator


@pytest.mark.parametrize("name", ALLOCATORS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_allocator_spends_exactly_the_step_budget(name, data):
    alloc = make_allocator(name, group_size=data.draw(st.integers(2, 6)), cap=data.draw(st.integers(3, 8)))
    budget = StepBudget(data.draw(st.integers(2, 24)), data.draw(st.integers(0, 3)))
    pool = data.draw(st.integers(budget.total // 2 + 1, 60))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    values = rng.random(pool)
    roots = alloc.allocate_roots(values, alloc.root_budget(budget), rng)
    assert all(m >= 2 and 0 <= i < pool for i, m in roots.items())
    spent = sum(roots.values())
    for m in roots.values():
        n_prefixes = int(rng.integers(0, 3 * m))
        counts, root_extra = expand_counts(alloc, rng.integers(0, 2, n_prefixes).astype(float),
                                           rng.random(n_prefixes), alloc.prefix_budget(m, budget), rng)
        assert len(counts) == n_prefixes and np.all(counts >= 0)
        spent += int(counts.sum()) + root_extra
    assert spent == budget.total


def test_grpo_gives_every_chosen_prompt_the_group_size():
    roots = make_allocator("grpo", group_size=4).allocate_roots(np.full(50, 0.5), 24, np.random.default_rng(0))
    assert len(roots) == 6 and set(roots.values()) == {4}


def test_pcl_picks_prompts_nearest_one_half():
    values = np.array([0.0, 0.45, 0.99, 0.6, 0.1, 0.52])
    roots = make_allocator("pcl", group_size=4).allocate_roots(values, 12, np.random.default_rng(0))
    assert sorted(roots) == [1, 3, 5]


def test_active_roots_skip_settled_prompts():
    values = np.array([0.0, 1.0, 0.5, 0.4, 0.999, 0.7])
    roots = make_allocator("trace").allocate_roots(values, 8, np.random.default_rng(0))
    assert set(roots) <= {2, 3, 5}


def test_active_prefixes_follow_surprise_and_uniform_do_not_read_values():
    rng = np.random.default_rng(0)
    r = np.array([1.0, 1.0, 0.0])
    v = np.array([0.99, 0.1, 0.02])
    assert make_allocator("trace").allocate_prefixes(r, v, 2, rng).tolist() == [0, 2, 0]
    counts = make_allocator("treepo").allocate_prefixes(r, v, 300, rng)
    assert counts.sum() == 300 and counts.min() > 50


def test_no_open_prefix_sends_budget_to_root():
    counts, extra = expand_counts(make_allocator("trace"), np.zeros(0), np.zeros(0), 6, np.random.default_rng(0))
    assert len(counts) == 0 and extra == 6


def test_pool_too_small_for_uniform_groups_raises():
    with pytest.raises(ConfigError, match="fix"):
        make_allocator("grpo", group_size=2).allocate_roots(np.full(3, 0.5), 12, np.random.default_rng(0))


def test_unknown_allocator_raises():
    with pytest.raises(ConfigError):
        make_allocator("ppo")


def test_every_allocator_name_has_its_stage_modes():
    from trace_gym.training.allocators import _MODES

    assert set(_MODES) == set(ALLOCATORS)
    for name in ALLOCATORS:
        alloc = make_allocator(name)
        assert alloc.name == name and alloc.oracle == (name == "oracle")
