import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trace_gym.toy_envs import DiceEnv, InventoryEnv, ObjectInventoryEnv
from trace_gym import SnapshotError, Task, TextEnv, TraceGymError, Turn
from trace_gym.checker import ConformanceError, check_trace_env, play_outcomes

ROLL = '<tool_call>{"name": "roll", "arguments": {"sides": 20}}</tool_call>'
ACTIONS = st.lists(st.one_of(st.just(ROLL), st.just("<answer>7</answer>"), st.text(max_size=40)), max_size=10)


def test_reset_info_has_task_messages_and_tools():
    obs, info = DiceEnv().reset(seed=0)
    assert info["task_id"].startswith("dice-") and obs in info["messages"][1]["content"]
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert {t["function"]["name"] for t in info["tools"]} == {"roll", "add"}


def test_error_observation_counts_as_a_turn():
    env = DiceEnv(max_turns=2)
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step("no tool here")
    assert obs.startswith("Error:") and info["error"] and (reward, term, trunc) == (0.0, False, False)
    *_, trunc, info = env.step('<tool_call>{"name": "roll", "arguments": {"sides": "x"}}</tool_call>')
    assert trunc and info["stop_reason"] == "max_turns"


def test_step_after_the_end_raises():
    env = DiceEnv()
    env.reset(seed=0)
    env.step("<answer>0</answer>")
    with pytest.raises(TraceGymError, match="episode is over"):
        env.step("<answer>0</answer>")


def test_snapshot_before_reset_raises():
    with pytest.raises(SnapshotError, match="reset"):
        DiceEnv().snapshot()


@settings(max_examples=60, deadline=None)
@given(ACTIONS, ACTIONS, st.integers(0, 2**16), st.sampled_from(["native", "replay"]))
def test_restore_then_replay_gives_identical_play_outcomes(prefix, future, seed, kind):
    env = DiceEnv(max_turns=30)
    env.reset(seed=seed)
    play_outcomes(env, prefix)
    snap = env.snapshot(kind)
    reference = play_outcomes(env, future)
    for attempt in range(2):  # the snapshot is reusable
        env.restore(snap)
        got = play_outcomes(env, future)
        first_diff = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), None)
        assert first_diff is None and len(got) == len(reference), f"attempt {attempt}: diverged at {first_diff}"


@settings(max_examples=30, deadline=None)
@given(ACTIONS, ACTIONS, st.integers(0, 2**16))
def test_replay_restore_into_another_instance_equals_native(prefix, future, seed):
    env = DiceEnv(max_turns=30)
    env.reset(seed=seed)
    play_outcomes(env, prefix)
    native, replay = env.snapshot("native"), env.snapshot("replay")
    env.restore(native)
    via_native = play_outcomes(env, future)
    other = DiceEnv(max_turns=30)
    other.reset(seed=seed + 1)
    assert other.restore(replay) == env.restore(native)
    assert play_outcomes(other, future) == via_native


def test_snapshot_into_a_different_env_type_raises():
    env = DiceEnv()
    env.reset(seed=0)
    snap = env.snapshot()

    class Other(DiceEnv):
        pass

    other = Other()
    other.reset(seed=0)
    with pytest.raises(SnapshotError, match="expected an env of type"):
        other.restore(snap)


def test_conformance_checker_passes_on_a_correct_env():
    check_trace_env(lambda: DiceEnv(max_turns=10), depth=3)


def test_conformance_checker_catches_state_missing_from_snapshots():
    class Forgetful(DiceEnv):
        episode_fields = ("rolls",)  # forgets "total"

    with pytest.raises(ConformanceError, match="total"):
        check_trace_env(lambda: Forgetful(max_turns=10), depth=3, skip_gym_check=True)


def sell(item: str, n: int) -> str:
    return f'<tool_call>{{"name": "sell", "arguments": {{"item": "{item}", "n": {n}}}}}</tool_call>'


COUNT = '<tool_call>{"name": "count", "arguments": {"item": "widget"}}</tool_call>'


class ForgetfulInventory(InventoryEnv):
    episode_fields = ()  # the README shape, without declaring the stock


def test_restore_returns_the_stock_of_the_snapshot_turn() -> None:
    env = InventoryEnv()
    env.reset(seed=0)
    env.step(sell("widget", 2))
    snap = env.snapshot()  # 8 widget
    env.step(sell("widget", 1))  # 7
    env.restore(snap)
    assert env.step(COUNT)[0] == "8"


def test_native_snapshot_refuses_episode_state_missing_from_episode_fields() -> None:
    """Stock left out of episode_fields: snapshot() refuses, instead of a restore reading 7 for a stock of 8."""
    env = ForgetfulInventory()
    env.reset(seed=0)
    env.step(sell("widget", 2))
    with pytest.raises(SnapshotError, match=r"\['stock'\].*episode_fields"):
        env.snapshot()


def test_replay_snapshots_need_no_declaration() -> None:
    env = ForgetfulInventory()
    env.reset(seed=0)
    env.step(sell("widget", 2))
    snap = env.snapshot("replay")
    env.step(sell("widget", 1))
    env.restore(snap)
    assert env.step(COUNT)[0] == "8"


def test_untracked_fields_are_neither_checked_nor_restored() -> None:
    class Counted(ForgetfulInventory):
        untracked_fields = ("stock",)

    env = Counted()
    env.reset(seed=0)
    env.step(sell("widget", 2))
    snap = env.snapshot()  # the author's call: declared as not episode state, so no SnapshotError
    assert snap.kind == "native"
    env.step(sell("widget", 1))  # 7 widget
    env.restore(snap)
    assert env.turn_count == 1 and env.step(COUNT)[0] == "7"  # the turn comes back, the untracked stock does not


def test_checker_catches_a_forgotten_episode_field_without_example_actions() -> None:
    with pytest.raises(ConformanceError, match="stock"):
        check_trace_env(ForgetfulInventory, skip_gym_check=True)


def test_checker_plays_schema_calls_and_catches_state_held_in_an_object() -> None:
    """Objects are compared by identity at snapshot time; the restore comparison is what catches these."""
    with pytest.raises(ConformanceError, match="native restore"):
        check_trace_env(ObjectInventoryEnv, skip_gym_check=True)


def test_checker_passes_the_inventory_env_that_declares_its_stock() -> None:
    check_trace_env(InventoryEnv)


class PartialCredit(TextEnv):
    def __init__(self) -> None:
        super().__init__(tasks=[Task("t", "say anything")], max_turns=3)

    def turn(self, action: str) -> Turn:
        return Turn("ok", reward=0.5)


def test_a_reward_on_a_turn_that_does_not_terminate_raises() -> None:
    env = PartialCredit()
    env.reset(seed=0)
    with pytest.raises(TraceGymError, match="expected reward 0 on a turn that does not terminate"):
        env.step("x")


def test_done_says_when_the_episode_is_over() -> None:
    env = DiceEnv(max_turns=2)
    env.reset(seed=0)
    assert not env.done
    env.step("<answer>0</answer>")
    assert env.done  # terminated by an answer


def test_done_says_when_the_episode_is_truncated() -> None:
    env = DiceEnv(max_turns=2)
    env.reset(seed=0)
    *_, truncated, _ = env.step(ROLL)
    assert not env.done and not truncated
    *_, truncated, info = env.step(ROLL)
    assert env.done and truncated and info["stop_reason"] == "max_turns"


def test_gymnasium_check_env_passes_through_gym_make():
    gym.register("test/Dice-v0", entry_point=DiceEnv)
    check_trace_env("test/Dice-v0")
