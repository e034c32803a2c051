"""The warm start: scripted-expert episodes played through the rollout collector, and `trace-gym sft` end to end."""

from __future__ import annotations

import json

import pytest

from tests.agents.calc_env import CalcEnv
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.errors import ConfigError
from trace_gym.training.driver.warm_start import collect_expert_episodes, held_out_eval


def test_expert_episodes_are_successful_tool_then_answer_chats():
    data = collect_expert_episodes(lambda: CalcEnv("train", digits=1), 40)
    assert len(data) == 40
    for episode in data:
        assert [m["role"] for m in episode] == ["system", "user", "assistant", "tool", "assistant"]
        assert episode[-1]["content"] == f"<answer>{episode[3]['content']}</answer>"


def test_expert_episodes_cycle_through_the_tasks_and_spare_the_holdout():
    env = CalcEnv("train", n=10, digits=1)
    prompts = [t.prompt for t in env.tasks]
    data = collect_expert_episodes(lambda: CalcEnv("train", n=10, digits=1), 16, seed=3, holdout=4)
    asked = [next(m["content"] for m in ep if m["role"] == "user") for ep in data]
    # tasks 7..9, 4..9, 4..8: never 0..3, the held-out prompts of an evaluation on the same env
    assert sorted(asked) == sorted(prompts[4 + (3 + i) % 6] for i in range(16))


def test_failed_expert_episodes_are_dropped_unless_asked_for():
    from trace_gym.environments.math.env import ArithmeticEnv

    def make():
        return ArithmeticEnv(n_tasks=30)

    kept = collect_expert_episodes(make, 30, noise=1.0)
    every = collect_expert_episodes(make, 30, noise=1.0, only_successful=False)
    assert len(every) == 30 and len(kept) < 30


def test_a_holdout_as_large_as_the_task_set_is_refused():
    with pytest.raises(ConfigError, match="holdout below"):
        collect_expert_episodes(lambda: CalcEnv("train", n=5), 3, holdout=5)


def test_the_expert_solves_every_held_out_task():
    env = CalcEnv("test", n=20)
    result = held_out_eval(ExpertPolicy(env.expert()), lambda: CalcEnv("test", n=20), n=20)
    assert result.success == 1.0 and len(result.tasks) == 20
    assert [t.task_id for t in result.tasks] == [t.id for t in env.tasks]  # the first 20 = all of them
    assert all(t.stop_reasons == ("answer",) for t in result.tasks)


@pytest.mark.slow
def test_trace_gym_sft_collects_trains_and_reports(tmp_path, capsys):
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.cli.main import main

    model = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    assert main(["sft", "--model", str(model), "--out", str(tmp_path / "out"), "--episodes", "24", "--steps", "3",
                 "--batch-size", "4", "--eval-episodes", "2", "--env-arg", "n_tasks=40"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index('{\n  "env"'):])  # printed last, after the progress bar
    assert summary["expert_episodes"] == 24 and summary["steps"] == 3
    assert 0.0 <= summary["success_after_greedy"] <= 1.0
    assert json.loads((tmp_path / "out" / "sft_summary.json").read_text()) == summary


@pytest.mark.slow
def test_trace_gym_sft_with_lora_changes_only_the_wrapped_projections(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.cli.main import main

    model = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    assert main(["sft", "--model", str(model), "--out", str(tmp_path / "out"), "--env",
                 "tests.agents.calc_env:CalcEnv", "--episodes", "8", "--steps", "2", "--batch-size", "4", "--lr",
                 "1e-2", "--lora-r", "4", "--lora-alpha", "8", "--eval-episodes", "2", "--env-arg", "n=40"]) == 0
    assert json.loads((tmp_path / "out" / "sft_summary.json").read_text())["lora_r"] == 4
    before = AutoModelForCausalLM.from_pretrained(model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)  # the adapter, merged; embeddings untouched


@pytest.mark.slow
def test_trace_gym_sft_takes_a_module_colon_class_env(tmp_path, capsys):
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.cli.main import main

    model = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    assert main(["sft", "--model", str(model), "--out", str(tmp_path / "out"), "--env",
                 "tests.agents.calc_env:CalcEnv", "--episodes", "8", "--steps", "1", "--batch-size", "4",
                 "--eval-episodes", "2", "--env-arg", "n=40"]) == 0
    summary = json.loads((tmp_path / "out" / "sft_summary.json").read_text())
    assert summary["env"] == "tests.agents.calc_env:CalcEnv" and summary["expert_episodes"] == 8


@pytest.mark.slow
def test_trace_gym_sft_evaluates_on_a_held_out_split_and_logs_every_phase(tmp_path, capsys, monkeypatch):
    """--eval-env-arg names the held-out split (as a run's env.eval_kwargs); each phase (expert episodes, held-out
    before, SFT steps, held-out after) writes progress lines to the log, not only the end."""
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.cli.main import main

    monkeypatch.setenv("TRACE_GYM_PROGRESS_INTERVAL", "0")
    model = build_tiny_model(tmp_path / "m", size="nano", seed=0)
    assert main(["sft", "--model", str(model), "--out", str(tmp_path / "out"), "--env",
                 "tests.agents.calc_env:CalcEnv", "--env-arg", "n=40", "--eval-env-arg", "split=test", "--episodes",
                 "8", "--steps", "1", "--batch-size", "4", "--eval-episodes", "3"]) == 0
    summary = json.loads((tmp_path / "out" / "sft_summary.json").read_text())
    assert summary["held_out_tasks"] == 3 and summary["held_out_errors"] == 0
    lines = capsys.readouterr().err.splitlines()
    for phase in ("expert episodes 8/8", "held-out before 3/3", "sft 1/1", "held-out after 3/3",
                  "held-out after, T = 1 3/3"):
        assert any(line.startswith(phase) for line in lines), phase


def test_expert_options_reach_the_envs_expert():
    from trace_gym.environments.math.env import ArithmeticEnv

    def make():
        return ArithmeticEnv(difficulty=1, n_tasks=12)

    guessed = collect_expert_episodes(make, 12, expert={"guess": 1.0})
    assert all([m["role"] for m in chat][-1] == "assistant" and not any(m["role"] == "tool" for m in chat)
               for chat in guessed)
    assert all(any(m["role"] == "tool" for m in chat) for chat in collect_expert_episodes(make, 12))
    with pytest.raises(ConfigError, match=r"sft\.expert"):
        collect_expert_episodes(make, 4, expert={"bogus": 1})


def test_sft_takes_env_arguments_as_eval_does(capsys):
    """One flag for an env's keyword arguments across the commands: --env-arg KEY=VALUE, values read as YAML."""
    from trace_gym.training.cli.main import main

    for command in ("sft", "eval"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "--env-arg KEY=VALUE" in text and "--env-kwargs" not in text, command
    assert main(["sft", "--model", "nowhere", "--env-arg", "n_tasks"]) == 2
