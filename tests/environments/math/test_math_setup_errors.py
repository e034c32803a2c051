"""A sandbox that cannot start is a setup failure: it raises out of ``step``, it is never shown to the model."""

from __future__ import annotations

import os

import pytest

from trace_gym.environments.math.env import ArithmeticEnv


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches to its user only when started as root")
def test_a_sandbox_that_cannot_start_raises_out_of_step() -> None:
    env = ArithmeticEnv(n_tasks=2, sandbox_user="trace-gym-no-such-user")
    env.reset(seed=0)
    try:
        with pytest.raises(KeyError, match="trace-gym-no-such-user"):
            env.step("<python>print(1)</python>")
    finally:
        env.close()
