from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym import RolloutTree


def build(spec):
    """spec: list of (parent_choice, terminal, reward); parents chosen among non-terminal nodes."""
    tree = RolloutTree("t", "prompt")
    for choice, terminal, reward in spec:
        open_nodes = [n.id for n in tree if not n.is_terminal]
        parent = open_nodes[choice % len(open_nodes)]
        tree.add(parent, f"a{len(tree)}", "obs", reward=float(reward), terminated=terminal)
    return tree


TREES = st.lists(st.tuples(st.integers(0, 50), st.booleans(), st.integers(0, 1)), max_size=40).map(build)


def hand_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3(1) 4(0) 5(1)
    tree = RolloutTree("t", "p")
    tree.add(0, "a", "o")
    tree.add(0, "b", "o")
    tree.add(1, "c", "o", reward=1, terminated=True)
    tree.add(1, "d", "o", reward=0, terminated=True)
    tree.add(2, "e", "o", reward=1, terminated=True)
    return tree


def test_values_by_hand():
    tree = hand_tree()
    assert tree.value(1) == 0.5 and tree.value(2) == 1.0
    assert tree.value(0) == 2 / 3  # 3 leaves, not the mean of the two children's values
    assert tree.is_mixed(0) and tree.is_mixed(1) and not tree.is_mixed(2)
    assert tree.sibling_groups() == [[1, 2], [3, 4]]
    assert [n.id for n in tree.path(4)] == [0, 1, 4]
    assert tree.actions(4) == ["a", "d"]


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_value_is_the_leaf_count_weighted_mean_of_children(tree):
    for node in tree:
        counted = [(tree.leaf_count(c), tree.value(c)) for c in node.children if tree.leaf_count(c)]
        if node.is_terminal:
            assert tree.value(node.id) == node.reward
        elif counted:
            n = sum(k for k, _ in counted)
            assert abs(tree.value(node.id) - sum(k * v for k, v in counted) / n) < 1e-12
        else:
            assert tree.value(node.id) is None


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_structure_invariants(tree):
    for node in tree:
        for child in node.children:
            assert tree[child].parent == node.id and tree[child].depth == node.depth + 1
        if node.is_terminal:
            assert node.children == []
    assert tree.leaf_count() == sum(1 for n in tree if n.is_terminal)


@settings(max_examples=50, deadline=None)
@given(TREES)
def test_json_round_trip(tree):
    again = RolloutTree.from_json(tree.to_json())
    assert again.to_dict() == tree.to_dict()


def test_a_token_record_saved_in_meta_loads_into_the_typed_fields():
    tree = RolloutTree("t", "prompt")
    tree.add(0, "a", "obs")
    data = tree.to_dict()
    for node in data["nodes"]:
        for key in ("prompt_ids", "obs_ids", "finish_reason", "prompt_tokens"):
            node.pop(key)
    data["nodes"][0]["meta"] = {"prompt_ids": [1, 2], "predicted": 0.5}
    data["nodes"][1]["meta"] = {"obs_ids": [3], "finish_reason": "stop", "prompt_tokens": 2}
    loaded = RolloutTree.from_dict(data)
    assert loaded.root.prompt_ids == [1, 2] and loaded.root.meta == {"predicted": 0.5}
    assert (loaded[1].obs_ids, loaded[1].finish_reason, loaded[1].prompt_tokens, loaded[1].meta) == (
        [3], "stop", 2, {})
