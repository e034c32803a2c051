import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trace_gym.toy_envs import DiceEnv
from trace_gym import SnapshotError, TraceGymError
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

    with pytest.raises(ConformanceError, match="native restore"):
        check_trace_env(lambda: Forgetful(max_turns=10), depth=3, skip_gym_check=True)


def test_gymnasium_check_env_passes_through_gym_make():
    gym.register("test/Dice-v0", entry_point=DiceEnv)
    check_trace_env("test/Dice-v0")
