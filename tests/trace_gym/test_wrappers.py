import pytest

from tests.trace_gym.toy_envs import DiceEnv
from trace_gym import RolloutTree, TraceGymError, TreeRolloutWrapper

ROLL = '<tool_call>{"name": "roll", "arguments": {"sides": 100}}</tool_call>'


@pytest.mark.parametrize("kind", ["native", "replay"])
def test_branch_makes_siblings_and_restores_state(kind):
    env = TreeRolloutWrapper(DiceEnv(max_turns=5), snapshot_kind=kind)
    env.reset(seed=1)
    env.step(ROLL)
    first, *_ = env.step(ROLL)
    env.step("<answer>0</answer>")
    _, info = env.branch(1)
    assert info["node_id"] == 1 and env.node_id == 1
    again, *_, step_info = env.step(ROLL)
    assert again == first  # same RNG state after the restore
    tree = env.tree
    assert tree[1].children == [2, step_info["node_id"]]
    assert tree.sibling_groups() == [[2, 4]]
    assert [n.id for n in tree.path(4)] == [0, 1, 4]


def test_cannot_branch_from_a_terminal_node():
    env = TreeRolloutWrapper(DiceEnv())
    env.reset(seed=0)
    env.step("<answer>1</answer>")
    with pytest.raises(TraceGymError, match="terminal"):
        env.branch(1)


def test_tree_records_rewards_and_round_trips():
    env = TreeRolloutWrapper(DiceEnv(n_tasks=1))
    env.reset(seed=0)
    env.step(ROLL)
    env.step(ROLL)
    env.step(f"<answer>{env.unwrapped.total}</answer>")
    tree = RolloutTree.from_json(env.tree.to_json())
    assert tree.leaves()[0].reward == 1.0 and tree.value() == 1.0
    assert tree.root.info["messages"][1]["role"] == "user"


def test_reset_releases_snapshots():
    env = TreeRolloutWrapper(DiceEnv())
    env.reset(seed=0)
    env.step(ROLL)
    assert set(env.snapshots) == {0, 1}
    env.reset(seed=1)
    assert set(env.snapshots) == {0}
