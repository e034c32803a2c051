"""The `trace-gym` command's surface: a user's mistake is one line (`error: ...; fix: ...`) with exit status 2
and no traceback, `--debug` shows the traceback, bugs keep theirs; help shows defaults; `envs` fits 80
columns."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trace_gym.errors import ConfigError
from trace_gym.registration import trace_env_ids
from trace_gym.training.cli.main import main, missing_package

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")


def user_error(capsys, argv: list[str]) -> str:
    """Run the command; assert it failed as a user error; return the one line it printed."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "fix: " in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_an_unknown_command_suggests_the_nearest(capsys):
    assert "did you mean 'train'?" in user_error(capsys, ["trian"])


def test_an_unknown_config_key_suggests_the_nearest(capsys):
    assert "did you mean optim.lr?" in user_error(capsys, ["train", "--config", QUICKSTART, "optim.lrr=1e-4"])


def test_a_key_in_the_wrong_section_names_the_sections_that_have_it(capsys):
    assert "optim.lr" in user_error(capsys, ["train", "--config", QUICKSTART, "lr=1e-4"])


def test_a_value_of_the_wrong_type_names_the_key_and_a_valid_value(capsys):
    assert "steps as an integer, got 'abc'; fix: steps=" in user_error(
        capsys, ["train", "--config", QUICKSTART, "steps=abc"])


def test_malformed_yaml_names_the_file_and_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\nalloc: {roots: 4\nseed: 1\n")
    line = user_error(capsys, ["train", "--config", str(bad)])
    assert str(bad) in line and "line 3" in line


def test_an_unknown_env_id_suggests_the_nearest(capsys, tmp_path):
    line = user_error(capsys, ["train", "--config", QUICKSTART, "env.id=trace/Arithmatic-v0",
                               f"run_dir={tmp_path}/run"])
    assert "did you mean 'trace/Arithmetic-v0'" in line and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("content", "expected"),
                         [(None, "no such file"), ("{not json", "expected a JSON array or JSON Lines")])
def test_a_missing_or_broken_math_data_file_is_one_line(capsys, tmp_path, content, expected):
    data = tmp_path / "problems.json"
    if content is not None:
        data.write_text(content)
    line = user_error(capsys, ["train", "--config", QUICKSTART, "env.id=trace/GSM8K-v0",
                               f"env.kwargs={{data_path: {data}}}", "env.eval_kwargs={}"])
    assert str(data) in line and expected in line


def test_an_env_that_is_no_text_env_is_refused_before_training(capsys, tmp_path):
    line = user_error(capsys, ["train", "--config", QUICKSTART, "env.id=CartPole-v1", "env.kwargs={}",
                               "env.eval_kwargs={}", f"run_dir={tmp_path}/run"])
    assert "expected env.id to name a trace_gym TextEnv" in line and "got CartPoleEnv" in line
    assert not (tmp_path / "run").exists()


def test_resume_of_a_folder_that_is_not_a_run_points_at_the_configs(capsys, tmp_path):
    line = user_error(capsys, ["train", "--resume", str(tmp_path)])
    assert "not a run folder" in line and "--config configs/quickstart.yaml" in line


def test_eval_without_a_config_names_the_eval_command(capsys):
    line = user_error(capsys, ["eval"])
    assert "trace-gym eval --checkpoint" in line and "trace-gym train" not in line


def test_sft_on_a_folder_that_is_not_a_model_says_so(capsys, tmp_path):
    line = user_error(capsys, ["sft", "--model", str(tmp_path)])
    assert "expected a model folder with config.json" in line and "trace-gym model init" in line


def test_debug_shows_the_traceback_instead():
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        main(["train", "--config", QUICKSTART, "optim.lrr=1e-4", "--debug"])


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    (tmp_path / "buggy_envs.py").write_text(textwrap.dedent("""
        from trace_gym import ToolEnv

        class BuggyEnv(ToolEnv):
            def load_tasks(self):
                return 1 / 0
    """))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ZeroDivisionError):
        main(["train", "--config", QUICKSTART, "env.id=buggy_envs:BuggyEnv", "env.kwargs={}", "env.eval_kwargs={}",
              f"run_dir={tmp_path}/run"])
    sys.modules.pop("buggy_envs", None)


def test_a_missing_optional_package_names_the_extra_to_install():
    try:
        import vllm  # noqa: F401
    except ModuleNotFoundError as exc:
        assert "pip install -e '.[vllm]'" in (missing_package(exc) or "")
    else:
        pytest.skip("vllm is installed here")
    assert missing_package(ModuleNotFoundError("no", name="not_an_optional_package")) is None


@pytest.mark.parametrize("command", ["envs", "rollout", "model", "sft", "train", "eval", "view", "plot"])
def test_every_command_has_help(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0 and f"trace-gym {command}" in capsys.readouterr().out


def test_sft_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 400)" in out and "(default: trace/Arithmetic-v0)" in out and "(default: None)" not in out


def test_envs_shows_every_id_in_full_at_80_columns():
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-m", "trace_gym.training.cli.main", "envs"], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    assert all(len(line) <= 80 for line in out.splitlines())
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("trace/")}
    assert listed == set(trace_env_ids())


def test_envs_lists_every_id_without_bfcl_eval_and_says_what_the_bfcl_ones_need(tmp_path):
    """A base install has no bfcl-eval: the listing still shows every env, each BFCL one with its install line."""
    from trace_gym.environments.bfcl.backends import BFCL_INSTALL

    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['bfcl_eval'] = None  # not installed\n")
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "trace_gym.training.cli.main", "envs"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("trace/")}
    assert set(rows) == set(trace_env_ids())
    bfcl = [i for i in rows if i.startswith("trace/BFCL")]
    assert bfcl and all("needs [1]" in rows[i] for i in bfcl)
    assert "needs" not in rows["trace/Arithmetic-v0"] and "python" in rows["trace/Arithmetic-v0"]
    assert f"[1] not installed here: {BFCL_INSTALL}" in " ".join(done.stdout.split())
