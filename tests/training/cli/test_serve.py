"""The options of `trace-gym serve`: the env's arguments as eval and sft take them (--env-arg KEY=VALUE,
repeatable, values read as YAML), or as one JSON object (--env-args), joined; a key given twice is one line."""

from __future__ import annotations

import argparse

import pytest

from trace_gym.errors import ConfigError
from trace_gym.training.cli.serve import add_arguments, env_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--env", "trace/Arithmetic-v0", *argv])


def test_env_arg_pairs_are_read_as_yaml_and_join_the_json_object():
    args = parse("--env-arg", "n_tasks=3", "--env-arg", "task_seed=1", "--env-args", '{"word_fraction": 0.0}')
    assert env_arguments(args) == {"n_tasks": 3, "task_seed": 1, "word_fraction": 0.0}
    assert env_arguments(parse()) == {}


def test_an_argument_given_by_both_flags_is_one_line_with_the_fix():
    with pytest.raises(ConfigError, match="n_tasks in both --env-args and --env-arg; fix: give it in one"):
        env_arguments(parse("--env-arg", "n_tasks=3", "--env-args", '{"n_tasks": 4}'))
    with pytest.raises(ConfigError, match="expected --env-arg KEY=VALUE"):
        env_arguments(parse("--env-arg", "n_tasks"))
