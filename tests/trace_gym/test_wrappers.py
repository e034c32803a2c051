import gymnasium as gym
import pytest

from tests.trace_gym.toy_envs import DiceEnv
from trace_gym import ConfigError, RolloutTree, TraceGymError, TreeRolloutWrapper

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


def _turns_until_truncated(env: TreeRolloutWrapper) -> int:
    turns = 0
    while True:
        turns += 1
        *_, truncated, _ = env.step(ROLL)
        if truncated:
            return turns


@pytest.mark.parametrize("kind", ["native", "replay"])
def test_branch_restores_a_time_limit_to_the_node(kind):
    env = TreeRolloutWrapper(gym.wrappers.TimeLimit(DiceEnv(max_turns=10), max_episode_steps=3), kind)
    env.reset(seed=0)
    assert _turns_until_truncated(env) == 3
    env.branch(1)  # depth 1: two turns left, not zero
    assert _turns_until_truncated(env) == 2
    env.branch(0)
    assert _turns_until_truncated(env) == 3


def test_branch_restores_episode_statistics():
    env = TreeRolloutWrapper(gym.wrappers.RecordEpisodeStatistics(DiceEnv(max_turns=3)))
    env.reset(seed=0)
    for _ in range(3):
        *_, info = env.step(ROLL)
    env.branch(1)
    env.step(ROLL)
    *_, info = env.step(ROLL)
    assert info["episode"]["l"] == 3


class _StepCount(gym.Wrapper):
    """A wrapper of the user's with a counter, without ``restore_branch``."""

    def __init__(self, env):
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        return self.env.step(action)


class _BranchAwareStepCount(_StepCount):
    def restore_branch(self, path):
        self.steps = len(path) - 1


def test_an_unknown_wrapper_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"_StepCount.*restore_branch"):
        TreeRolloutWrapper(_StepCount(DiceEnv()))


def test_a_branch_aware_wrapper_is_restored():
    inner = _BranchAwareStepCount(DiceEnv(max_turns=5))
    env = TreeRolloutWrapper(inner)
    env.reset(seed=0)
    for _ in range(3):
        env.step(ROLL)
    env.branch(1)
    assert inner.steps == 1


def test_a_gym_make_chain_with_a_time_limit_branches():
    env = TreeRolloutWrapper(gym.make("trace/Arithmetic-v0", max_episode_steps=3))
    env.reset(seed=0)
    for _ in range(3):
        *_, truncated, _ = env.step("<python>print(1)</python>")
    assert truncated
    env.branch(1)
    *_, truncated, _ = env.step("<python>print(1)</python>")
    assert not truncated  # depth 2 of 3
