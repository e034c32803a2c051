"""A model's BFCL call runs bounded: a call that would compute for seconds returns an error at its
deadline, process-wide precision set by a call never reaches the trainer, and the episode goes on."""

from __future__ import annotations

import decimal
import time

import mpmath
import pytest

from trace_gym.environments.bfcl import backends
from trace_gym.environments.bfcl.env import BFCLMultiTurnEnv

HOSTILE = ["[power(base=10, exponent=10000000)]", "[square_root(number=2, precision=1000000)]"]


@pytest.fixture(scope="module")
def env():
    e = BFCLMultiTurnEnv("multi_turn_base", split="all")
    yield e
    e.close()


def _math_task(env):
    return next(t for t in env.tasks if "MathAPI" in t.meta["involved_classes"])


@pytest.mark.parametrize("action", HOSTILE)
def test_a_hostile_call_returns_an_error_at_its_deadline(env, action) -> None:
    env.reset(options={"task": _math_task(env)})
    env.step("[mean(numbers=[1, 2, 3])]")  # warm: the bound below is about the call
    start = time.monotonic()
    obs, _reward, terminated, truncated, info = env.step(action)
    elapsed = time.monotonic() - start
    assert "stopped" in obs and "timed out" in obs and "error" in info
    assert elapsed < backends.CALL_BOUND.timeout_s + 25  # only a hang exceeds this
    assert not terminated and not truncated
    obs, *_ = env.step("[square_root(number=16, precision=5)]")
    assert "4" in obs  # the episode goes on


def test_process_wide_precision_set_by_calls_stays_out_of_this_process(env) -> None:
    env.reset(options={"task": _math_task(env)})
    before = mpmath.mp.dps, decimal.getcontext().prec
    obs, *_ = env.step("[logarithm(value=10, base=2, precision=80)]")
    assert "3.32192809488736234787031942948939017586483139302458061205475639581593" in obs  # 80 digits were used
    env.step("[square_root(number=2, precision=300)]")
    assert (mpmath.mp.dps, decimal.getcontext().prec) == before


def test_state_changes_of_a_bounded_call_land_on_the_same_instance(env) -> None:
    task = next(t for t in env.tasks if "GorillaFileSystem" in t.meta["involved_classes"])
    env.reset(options={"task": task})
    fs = env.instances["GorillaFileSystem"]
    env.step("[mkdir(dir_name='made_by_a_bounded_call')]")
    assert env.instances["GorillaFileSystem"] is fs
    assert "made_by_a_bounded_call" in env.step("[ls()]")[0]
    snap = env.snapshot()
    env.step("[mkdir(dir_name='after_the_snapshot')]")
    env.restore(snap)
    listing = env.step("[ls()]")[0]
    assert "made_by_a_bounded_call" in listing and "after_the_snapshot" not in listing
