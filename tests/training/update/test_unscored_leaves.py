"""Leaves without an outcome (a generation out of retries, an env step whose infrastructure failed) are left out
of what the update learns from: they change no value or advantage, and their own turns are not trained."""

import pytest

from trace_gym.training.config import ADVANTAGE_METHODS
from trace_gym.training.step import build_samples
from trace_gym.training.update.advantages import tree_advantages
from trace_gym.tree import RolloutTree
from trace_gym.tree_stats import UNSCORED, tree_values


def _tree(unscored: list[str]) -> RolloutTree:
    """root -> a; a -> a success (1) and a failure (0); root -> b, a failure (0); then one leaf per stop reason of
    ``unscored`` under a, each with the tokens and logprobs of a sampled turn."""
    tree = RolloutTree("t", "prompt")
    a = tree.add(0, "a", "obs")
    b = tree.add(0, "b", "", reward=0.0, terminated=True)
    win = tree.add(a.id, "win", "", reward=1.0, terminated=True)
    lose = tree.add(a.id, "lose", "", reward=0.0, terminated=True)
    for reason in unscored:
        tree.add(a.id, "unchecked", "Error: ...", truncated=True, info={"stop_reason": reason, "error": "why"})
    for node in (a, b, win, lose, *tree.nodes[5:]):
        node.token_ids, node.logprobs = [1, 2], [-0.5, -0.5]
    tree.root.prompt_ids, a.obs_ids = [0], [3]
    return tree


@pytest.mark.parametrize("method", ADVANTAGE_METHODS)
def test_unscored_leaves_change_no_advantage_and_are_not_trained(method):
    clean, noisy = _tree([]), _tree(sorted(UNSCORED))
    assert set(UNSCORED) == {"server_error", "infra_error"}
    clean_adv, noisy_adv = tree_advantages(clean, method), tree_advantages(noisy, method)
    assert noisy_adv == pytest.approx(clean_adv) and not set(noisy_adv) & {5, 6}
    samples = build_samples({"t": noisy}, method, skip_zero=False)
    assert len(samples.samples) == len(build_samples({"t": clean}, method, skip_zero=False).samples)


def test_an_unscored_leaf_is_no_zero_in_a_value():
    values, counts = tree_values(_tree(["infra_error", "server_error"]))
    assert values[1] == pytest.approx(0.5) and counts[1] == 2 and counts[0] == 3  # a: (1 + 0) / 2, not (1+0+0+0)/4


def test_a_prefix_whose_only_leaf_is_unscored_is_not_trained():
    tree = RolloutTree("t", "prompt")
    a = tree.add(0, "a", "obs")
    tree.add(a.id, "unchecked", "", truncated=True, info={"stop_reason": "infra_error", "error": "why"})
    tree.add(0, "b", "", reward=1.0, terminated=True)
    assert set(tree_advantages(tree, "grpo")) == {3}
