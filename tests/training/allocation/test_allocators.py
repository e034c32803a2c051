import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.errors import ConfigError
from trace_gym.training.allocation.allocators import expand_counts, make_allocator
from trace_gym.training.config import ALLOCATORS, StepBudget


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
    from trace_gym.training.allocation.allocators import _MODES, VARIANTS

    assert set(_MODES) | set(VARIANTS) | {"trace_adaptive"} == set(ALLOCATORS)
    for name in ALLOCATORS:
        alloc = make_allocator(name)
        assert alloc.name == name and alloc.oracle == (name == "oracle")


# ----------------------------------------------------------------- trace_adaptive
from trace_gym.training.allocation.allocators import (  # noqa: E402
    AdaptiveAllocator,
    bare_rewards,
    mixed_share,
)
from trace_gym.tree import RolloutTree  # noqa: E402


def group_tree(tid: str, rewards: list[float], continuation: float | None = None) -> RolloutTree:
    """Two-turn bare rollouts with the given final rewards; optionally one continuation from the first
    rollout's middle node (created after every bare rollout, as the collector does)."""
    tree = RolloutTree(tid, f"prompt {tid}")
    mids = []
    for j, r in enumerate(rewards):
        mid = tree.add(0, f"think {j}", "obs")
        mids.append(mid.id)
        tree.add(mid.id, f"answer {j}", "", r, terminated=True)
    if continuation is not None:
        tree.add(mids[0], "answer again", "", continuation, terminated=True)
    return tree


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_trace_adaptive_spends_exactly_the_step_budget_at_any_trust(data):
    alloc = AdaptiveAllocator(group_size=data.draw(st.integers(2, 6)), cap=data.draw(st.integers(3, 8)))
    alloc.trust = data.draw(st.floats(0.0, 1.0))
    budget = StepBudget(data.draw(st.integers(2, 24)), data.draw(st.integers(0, 3)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    roots = alloc.allocate_roots(rng.random(data.draw(st.integers(budget.total // 2 + 1, 60))),
                                 alloc.root_budget(budget), rng)
    assert all(m >= 2 for m in roots.values())
    assert sum(roots.values()) + sum(alloc.prefix_budget(m, budget) for m in roots.values()) == budget.total
    active, uniform = alloc.split(budget.roots)
    assert active + uniform == budget.roots and active % 2 == 0 and uniform != 1


def test_mixed_share_is_unbiased_for_the_mixed_probability():
    from math import comb

    n = 8
    for p in (0.05, 0.3, 0.5, 0.9):
        pmf = np.array([comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])
        for m in (1, 2, 3, 5, 8):
            expected = float(pmf @ mixed_share(np.arange(n + 1), np.full(n + 1, n), np.full(n + 1, m)))
            assert expected == pytest.approx(1 - p**m - (1 - p) ** m, abs=1e-12)


def test_bare_rewards_follow_the_first_created_branch():
    tree = group_tree("t", [1.0, 0.0, 1.0], continuation=0.0)
    assert bare_rewards(tree) == [1.0, 0.0, 1.0]


def run_trust(values_of, p_of, steps: int, seed: int = 0) -> list[float]:
    """Trust after each step of a pool of 64 prompts with success probabilities p_of(i), valued values_of(i)."""
    alloc, budget = AdaptiveAllocator(group_size=8, cap=8), StepBudget(32, 1)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        p = np.array([p_of(i, rng) for i in range(64)])
        values = np.array([values_of(i, pi, rng) for i, pi in enumerate(p)])
        roots = alloc.allocate_roots(values, alloc.root_budget(budget), rng)
        trees = {i: group_tree(str(i), [float(rng.random() < p[i]) for _ in range(m)]) for i, m in roots.items()}
        out.append(alloc.observe(trees)["alloc/trust"])
    return out


def test_trust_grows_when_values_find_the_mixed_prompts_of_a_polarised_pool():
    # Most prompts settled (p = 0 or 1), a few at 1/2; the values know which: active roots beat uniform groups.
    trust = run_trust(lambda i, p, rng: p, lambda i, rng: 0.5 if i % 8 == 0 else float(i % 2), steps=12)
    assert trust[0] == 0.0 and trust[-1] > 0.8


def test_trust_stays_low_when_values_carry_no_information():
    # Every prompt mixed-ish (p = 0.7), values random: groups of 8 are mixed more often than 2-3 rollouts.
    trust = run_trust(lambda i, p, rng: float(rng.random()), lambda i, rng: 0.7, steps=16)
    assert np.mean(trust[-8:]) < 0.3


def test_trace_adaptive_state_round_trips():
    a = AdaptiveAllocator()
    a.trust, a.records = 0.4, [(0.5, 3, 8, 1.0), (0.1, 0, 8, 0.0)]
    b = AdaptiveAllocator()
    b.load_state_dict(a.state_dict())
    assert b.trust == 0.4 and b.records == a.records


def test_trace_keeps_the_papers_allocator():
    alloc = make_allocator("trace")
    assert (alloc.roots, alloc.prefixes, alloc.oracle) == ("active", "active", False)
    assert alloc.observe({}) == {} and alloc.state_dict() == {}
