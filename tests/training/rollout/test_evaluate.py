"""Held-out evaluation as bare rollouts through the collector: per-prompt outcomes, 95% intervals over prompts,
paired differences, rows and trees on disk."""

from __future__ import annotations

import json
import math

import pytest

from tests.agents.calc_env import CalcEnv
from trace_gym.agents.policy import SamplingParams
from trace_gym.agents.scripted import ExpertPolicy
from trace_gym.errors import ConfigError
from trace_gym.training.rollout.collector import TreeCollector
from trace_gym.training.rollout.evaluate import (
    HELD_OUT,
    EpisodeRow,
    EvalResult,
    EvalStopped,
    TaskOutcome,
    evaluate,
    evaluate_policy,
    paired_difference,
)
from trace_gym.training.stats import PairedDifference
from trace_gym.training.viz.viewer import load_trees


def outcomes(successes: dict[str, list[float]]) -> EvalResult:
    return EvalResult([TaskOutcome(tid, tuple(r), tuple(1 for _ in r), tuple("answer" for _ in r))
                       for tid, r in successes.items()], seed=0)


def test_success_and_interval_are_over_prompts():
    result = outcomes({"a": [1.0, 1.0], "b": [1.0, 0.0], "c": [0.0, 0.0], "d": [1.0, 0.0]})
    assert [t.success for t in result.tasks] == [1.0, 0.5, 0.0, 0.5]
    assert result.success == 0.5 and result.episodes == 8
    # Wilson over the 4 prompts at 0.5: centre 0.5, half-width z * sqrt(1/16 + z^2/64) / (1 + z^2/4)
    z = 1.959964
    half = z * math.sqrt(0.25 / 4 + z * z / 64) / (1 + z * z / 4)
    assert result.interval() == pytest.approx((0.5 - half, 0.5 + half))
    m = result.metrics()
    assert m["eval/success"] == 0.5 and m["eval/success_hi"] == pytest.approx(0.5 + half)


@pytest.mark.parametrize(("n", "lo"), [(5, 0.5655), (50, 0.9287)])
def test_an_all_success_evaluation_has_an_interval_below_1_that_narrows_with_more_prompts(n, lo):
    """5 of 5 and 50 of 50 are not the same evidence: a t-interval says [1, 1] for both, Wilson's does not."""
    result = outcomes({f"t{i}": [1.0] for i in range(n)})
    assert result.interval() == pytest.approx((lo, 1.0), abs=1e-4)
    none = outcomes({f"t{i}": [0.0] for i in range(n)})
    assert none.interval() == pytest.approx((0.0, 1 - lo), abs=1e-4)


def test_paired_difference_uses_per_prompt_differences():
    before = outcomes({"a": [0.0], "b": [1.0], "c": [0.0], "d": [1.0]})
    after = outcomes({"d": [1.0], "c": [1.0], "b": [1.0], "a": [1.0]})  # order does not matter, prompts do
    diff = paired_difference(before, after)
    # differences (1, 0, 1, 0): mean 0.5, sd sqrt(1/3), t(3) = 3.182
    half = 3.182 * math.sqrt(1 / 3) / 2
    assert (diff.mean, diff.tasks) == (0.5, 4) and (diff.lo, diff.hi) == pytest.approx((0.5 - half, 0.5 + half))
    same = paired_difference(before, before)
    assert same.mean == same.lo == same.hi == 0.0  # no spread: a zero-width interval


def test_paired_difference_of_any_per_prompt_measure_matches_the_evaluations():
    # The shuffled-advantage check pairs per-prompt probabilities, not EvalResults: the same summary.
    before = outcomes({"a": [0.0], "b": [1.0], "c": [0.0], "d": [1.0]})
    after = outcomes({"a": [1.0], "b": [1.0], "c": [1.0], "d": [1.0]})
    assert PairedDifference.of([1.0, 0.0, 1.0, 0.0]) == paired_difference(before, after)


def test_paired_difference_refuses_different_prompts():
    with pytest.raises(ConfigError, match="same prompts"):
        paired_difference(outcomes({"a": [1.0]}), outcomes({"b": [1.0]}))


@pytest.fixture(scope="module")
def calc():
    env = CalcEnv("test", n=70, digits=2)
    collector = TreeCollector(ExpertPolicy(env.expert()), lambda: CalcEnv("test", n=70, digits=2), env.tasks,
                              SamplingParams(), snapshot_kind="replay", workers=1)
    yield collector, list(env.tasks)
    collector.close()


def test_evaluation_plays_every_sample_of_every_prompt(calc):
    collector, tasks = calc
    result = evaluate(collector, tasks, samples=2, seed=1)  # 140 episodes, 64 at once
    assert [t.task_id for t in result.tasks] == [t.id for t in tasks]
    assert all(t.rewards == (1.0, 1.0) and t.turns == (2, 2) and t.stop_reasons == ("answer", "answer")
               for t in result.tasks)
    assert result.success == 1.0 and result.episodes == 140 and result.trees == []
    assert all(t.tool_calls == (1, 1) for t in result.tasks) and result.metrics()["eval/tool_use"] == 1.0


def test_tool_use_is_the_share_of_samples_that_called_a_tool():
    result = EvalResult([TaskOutcome("a", (1.0, 0.0), (2, 1), ("answer",) * 2, tool_calls=(1, 0)),
                         TaskOutcome("b", (0.0, 0.0), (1, 1), ("answer",) * 2, tool_calls=(0, 0))], seed=0)
    assert [t.tool_use for t in result.tasks] == [0.5, 0.0] and result.tool_use == 0.25


def test_evaluation_writes_rows_and_trees_the_viewer_reads(calc, tmp_path):
    collector, tasks = calc
    result = evaluate(collector, tasks[:3], samples=2, seed=2, keep_trees=True)
    assert [t.task_id for t in result.trees] == [t.id for t in tasks[:3]]
    result.write(tmp_path / "rows.jsonl", tmp_path / "trees.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert rows == result.rows() and [(r["task_id"], r["episode"]) for r in rows[:2]] == [(tasks[0].id, 0),
                                                                                           (tasks[0].id, 1)]
    assert [EpisodeRow.from_row(r) for r in rows] == [e for t in result.tasks for e in t.episodes()]
    shown = load_trees([tmp_path / "trees.jsonl"])
    assert [r.tree.to_dict() for r in shown] == [t.to_dict() for t in result.trees]


def test_eval_command_reports_success_with_its_interval(tmp_path, capsys):
    import argparse

    from tests.training.parity_env import ENTRY_POINT
    from trace_gym.agents.tiny import build_tiny_model
    from trace_gym.training.cli import eval as cli

    model = build_tiny_model(tmp_path / "nano", size="nano", seed=0)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    config = tmp_path / "eval.yaml"
    config.write_text(f"model: {{path: {model}}}\nenv: {{id: '{ENTRY_POINT}', kwargs: {{n_tasks: 4}}}}\n"
                      "rollout: {max_new_tokens: 4, max_context: 256}\n")
    args = parser.parse_args(["--config", str(config), "--json", "eval.tasks=4", "eval.samples=2",
                              "eval.temperature=1.0"])
    assert cli.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["tasks"], out["samples"], out["episodes"]) == (4, 2, 8) and out["model"] == str(model)
    lo, hi = out["success_ci95"]
    assert lo <= out["success"] <= hi


def test_branches_continue_each_tree_from_its_open_nodes():
    from trace_gym.training.rollout.evaluate import evaluate_policy

    env = CalcEnv("test", n=5, digits=2)
    result = evaluate_policy(ExpertPolicy(env.expert()), lambda: CalcEnv("test", n=5, digits=2), env.tasks,
                             samples=2, seed=3, keep_trees=True, workers=1, branches=3)
    assert result.episodes == 5 * (2 + 3) and all(len(t.rewards) == 5 for t in result.tasks)
    for tree in result.trees:
        assert len(tree.leaves()) == 5 and len(tree.root.children) >= 2
        # every continuation hangs off a node that was open (non-terminal) when it was drawn
        assert all(not tree[n.parent].is_terminal for n in tree.nodes[1:])


def test_branch_points_and_samples_repeat_with_the_seed():
    from trace_gym.agents.specs import policy_from_spec
    from trace_gym.env_specs import env_factory
    from trace_gym.training.rollout.evaluate import evaluate_policy

    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 4})
    runs = [evaluate_policy(policy_from_spec("expert:0.5", make_env=make_env), make_env, 4, seed=seed,
                            keep_trees=True, branches=2) for seed in (7, 7, 8)]
    first, again, other = ([t.to_dict() for t in r.trees] for r in runs)
    assert first == again and first != other


def test_progress_hears_every_episode_up_to_the_total():
    from trace_gym.training.rollout.evaluate import evaluate_policy

    env = CalcEnv("test", n=6, digits=2)
    heard: list[tuple[int, int]] = []
    evaluate_policy(ExpertPolicy(env.expert()), lambda: CalcEnv("test", n=6, digits=2), env.tasks, samples=2,
                    workers=2, branches=1, progress=lambda done, total: heard.append((done, total)))
    assert {total for _, total in heard} == {18} and heard[-1][0] == 18
    assert len(heard) > 2 and [d for d, _ in heard] == sorted(d for d, _ in heard)


def test_evaluation_imports_without_torch() -> None:
    """Evaluating a served or scripted policy needs no local model: torch is imported only where a model is."""
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; import trace_gym.training.rollout.evaluate"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


# ----------------------------------------------------------------------------- episodes, one by one
def test_episodes_the_infrastructure_ended_are_counted_apart_and_never_lower_the_success():
    result = EvalResult([TaskOutcome("a", (1.0, 0.0), (2, 1), ("answer", "server_error")),
                         TaskOutcome("b", (0.0, 1.0), (1, 2), ("infra_error", "answer")),
                         TaskOutcome("c", (0.0,), (1,), ("server_error",))], seed=0)
    assert [t.success for t in result.tasks][:2] == [1.0, 1.0] and math.isnan(result.tasks[2].success)
    assert result.success == 1.0 and result.scored == 2 and result.episodes == 5
    assert result.infra == {"server_error": 2, "infra_error": 1} and result.metrics()["eval/errors"] == 3.0
    z = 1.959964  # Wilson over the 2 prompts scored, both succeeding: [n / (n + z^2), 1]
    assert result.interval() == pytest.approx((2 / (2 + z * z), 1.0))


class CountingPolicy:
    """A real policy (the env's scripted expert) whose generate calls are recorded: how many episodes each
    turn carried."""

    def __init__(self, policy):
        self.policy, self.batches = policy, []

    def generate(self, requests, sampling):
        self.batches.append(len(requests))
        return self.policy.generate(requests, sampling)


def test_at_most_in_flight_episodes_run_at_once_and_each_is_heard_as_it_ends():
    env = CalcEnv("test", n=10, digits=2)
    policy = CountingPolicy(ExpertPolicy(env.expert()))
    heard: list[EpisodeRow] = []
    result = evaluate_policy(policy, lambda: CalcEnv("test", n=10, digits=2), env.tasks, samples=1, workers=1,
                             in_flight=3, on_episode=heard.append)
    assert max(policy.batches) == 3 and sum(policy.batches) == 20  # 10 episodes of 2 turns, 3 at a time
    # an episode ends every turn from the second on: the rows do not wait for the evaluation's end
    assert len(heard) == 10 and [e.task_id for e in heard][:3] == [t.id for t in env.tasks[:3]]
    assert result.episodes == 10 and result.success == 1.0


def test_kept_episodes_are_not_played_again_and_the_result_is_the_uninterrupted_one():
    from trace_gym.agents.specs import policy_from_spec
    from trace_gym.env_specs import env_factory

    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 6})
    whole = evaluate_policy(policy_from_spec("expert:0.5", make_env=make_env), make_env, 6, samples=2, seed=5,
                            in_flight=4)
    kept = [e for t in whole.tasks for e in t.episodes()][:5]
    heard: list[EpisodeRow] = []
    again = evaluate_policy(policy_from_spec("expert:0.5", make_env=make_env), make_env, 6, samples=2, seed=5,
                            in_flight=3, kept=kept, on_episode=heard.append)
    assert len(heard) == 7 and not {(e.task_id, e.episode) for e in heard} & {(e.task_id, e.episode) for e in kept}
    assert again.rows() == whole.rows() and 0 < whole.success < 1  # the seeds are the episodes', not the batch's


def test_the_breaker_stops_after_failed_requests_in_a_row_and_keeps_what_finished():
    from tests.agents.openai_server import ScriptedServer, chat
    from trace_gym.agents.specs import PolicyOptions, policy_from_spec
    from trace_gym.env_specs import env_factory

    make_env = env_factory("trace/Arithmetic-v0", {"n_tasks": 10, "max_turns": 1})
    calls = {"n": 0}

    def dies_after_two(path: str, body: dict):
        calls["n"] += 1
        return chat("<answer>0</answer>") if calls["n"] <= 2 else (503, {"Retry-After": "0"}, b"{}")

    heard: list[EpisodeRow] = []
    with ScriptedServer(dies_after_two) as server:
        policy = policy_from_spec(server.url, PolicyOptions(max_retries=0, concurrency=1), make_env)
        with pytest.raises(EvalStopped, match="3 episodes in a row") as stopped:
            evaluate_policy(policy, make_env, 10, on_episode=heard.append, breaker=3)
    assert [e.stop_reason for e in heard] == ["answer"] * 2 + ["server_error"] * 3  # 5 of 10 played, no more
    assert stopped.value.result.episodes == 5 and stopped.value.result.scored == 2


def test_the_held_out_defaults_are_the_run_configs():
    from trace_gym.training.config import EvalConfig, RolloutConfig

    assert (HELD_OUT.tasks, HELD_OUT.samples, HELD_OUT.temperature) == (EvalConfig().tasks, 1, 0.0)
    assert HELD_OUT.max_new_tokens == RolloutConfig().max_new_tokens
