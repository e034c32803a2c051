"""`trace-gym eval --env ID --policy SPEC` through the real command: every form of spec on real envs (the
scripted expert on Arithmetic and HotpotQA, a model folder from `trace-gym model init`, a real local
OpenAI-compatible HTTP server), the success with its 95% interval, per-task rows and trees that `trace-gym view`
renders, server flags (concurrency, retries, API key), the progress bar on a terminal only, and every bad
spec or flag as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agents.openai_server import ScriptedServer, chat
from trace_gym.env_specs import make_env
from trace_gym.training.cli.main import main
from trace_gym.training.viz.viewer import load_trees

ROOT = Path(__file__).resolve().parents[3]
ARITH = ["--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=6"]


def run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def user_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "fix: " in err[0], err
    return err[0]


# ----------------------------------------------------------------------------- the scripted expert


def test_eval_of_the_expert_prints_the_success_with_its_95_percent_interval(capsys):
    assert main(["eval", *ARITH, "--policy", "expert:0.5", "--samples", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trace-gym eval" in out and "12 (6 tasks x 2 samples)" in out
    assert "95% interval" in out and "expert:0.5" in out


def test_the_noiseless_expert_solves_every_task_and_the_summary_says_so(capsys):
    summary = run_json(capsys, ["eval", *ARITH, "--policy", "expert", "--samples", "3"])
    assert (summary["tasks"], summary["episodes"], summary["success"]) == (6, 18, 1.0)
    lo, hi = summary["success_ci95"]  # Wilson over 6 tasks: 6 of 6 still leaves room below 1
    assert 0.55 < lo < 0.62 and hi == 1.0 and summary["stop_reasons"] == {"answer": 18}
    assert summary["errors"] == 0 and summary["first_error"] is None
    assert summary["env_args"] == {"n_tasks": 6} and summary["mixed_tasks"] == 0


def test_eval_on_hotpotqa_writes_rows_and_trees_that_view_renders(capsys, tmp_path):
    out = tmp_path / "hotpot"
    summary = run_json(capsys, ["eval", "--env", "trace/HotpotQA-v0", "--policy", "expert:0.3", "--tasks", "4",
                                "--samples", "2", "--out", str(out), "--trees"])
    rows = rows_of(out / "rows.jsonl")
    assert len(rows) == 8 and [r["episode"] for r in rows] == [0, 1] * 4
    assert sum(r["reward"] for r in rows) / 8 == pytest.approx(summary["success"])
    assert json.loads((out / "summary.json").read_text())["files"]["trees"] == str(out / "trees.jsonl")
    trees = load_trees([out / "trees.jsonl"])
    assert sorted(t.tree.task_id for t in trees) == sorted({r["task_id"] for r in rows})
    assert main(["view", str(out / "trees.jsonl"), "--out", str(tmp_path / "page.html")]) == 0
    assert rows[0]["task_id"] in (tmp_path / "page.html").read_text()


def test_a_jsonl_out_receives_the_rows_alone(capsys, tmp_path):
    run_json(capsys, ["eval", *ARITH, "--policy", "expert", "--out", str(tmp_path / "rows.jsonl")])
    assert [r["success"] for r in rows_of(tmp_path / "rows.jsonl")] == [1.0] * 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "rows.settings.json"]  # what --resume reads


def test_env_args_reach_the_env_as_yaml_values(capsys):
    summary = run_json(capsys, ["eval", "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=3",
                                "--env-arg", "max_turns=1", "--policy", "expert"])
    # one turn allows the python call only: every episode ends at max_turns without an answer
    assert summary["tasks"] == 3 and summary["stop_reasons"] == {"max_turns": 3} and summary["success"] == 0.0


def test_tasks_zero_plays_every_task_of_the_env(capsys):
    assert run_json(capsys, ["eval", *ARITH, "--policy", "expert", "--tasks", "0"])["tasks"] == 6


# ----------------------------------------------------------------------------- a model folder


def test_eval_of_a_model_folder_built_by_model_init(capsys, tmp_path):
    model = tmp_path / "nano"
    assert main(["model", "init", "--out", str(model), "--size", "nano"]) == 0
    capsys.readouterr()
    summary = run_json(capsys, ["eval", *ARITH, "--policy", str(model), "--tasks", "2", "--samples", "2",
                                "--max-new-tokens", "4", "--temperature", "1", "--out", str(tmp_path / "out"),
                                "--trees"])
    assert (summary["policy"], summary["episodes"], summary["max_new_tokens"]) == (str(model), 4, 4)
    trees = load_trees([tmp_path / "out" / "trees.jsonl"])
    # a model policy records the exact sampled token ids, at most --max-new-tokens per turn
    turns = [n for t in trees for n in t.tree.nodes[1:]]
    assert turns and all(1 <= len(n.token_ids) <= 4 for n in turns)
    assert all(t.tree.root.prompt_ids for t in trees)


# ----------------------------------------------------------------------------- an OpenAI-compatible server


def answers_half(n_tasks: int):
    """A server script that answers the even-numbered Arithmetic tasks right and the others wrong."""
    env = make_env("trace/Arithmetic-v0", n_tasks=n_tasks)
    tasks = env.unwrapped.tasks
    env.close()
    right = {t.prompt: (t.answer if i % 2 == 0 else "wrong") for i, t in enumerate(tasks)}

    def script(path: str, body: dict):
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return chat(f"<answer>{right[question]}</answer>")

    return script


def test_eval_against_a_server_measures_its_answers(capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with ScriptedServer(answers_half(6), models=("served-model",)) as server:
        summary = run_json(capsys, ["eval", *ARITH, "--policy", "openai", "--base-url", server.url, "--model",
                                    "served-model", "--samples", "2", "--temperature", "0.7",
                                    "--max-new-tokens", "32"])
    assert summary["success"] == 0.5 and summary["episodes"] == 12 and summary["mixed_tasks"] == 0
    posts = [r for r in server.requests if r["path"].endswith("/chat/completions")]
    assert len(posts) == 12
    assert {(r["body"]["model"], r["body"]["temperature"], r["body"]["max_tokens"]) for r in posts} == \
        {("served-model", 0.7, 32)}
    assert {r["headers"]["Authorization"] for r in posts} == {"Bearer sk-test"}


def test_the_model_name_in_the_spec_needs_no_model_flag(capsys):
    with ScriptedServer(answers_half(6), models=("a", "b")) as server:
        summary = run_json(capsys, ["eval", *ARITH, "--policy", "openai:b", "--base-url", server.url])
    assert summary["policy"] == "openai:b" and {r["body"]["model"] for r in server.requests if r["body"]} == {"b"}


def test_concurrency_bounds_the_requests_in_flight(capsys):
    with ScriptedServer(answers_half(6), hold=0.2) as server:
        run_json(capsys, ["eval", *ARITH, "--policy", server.url, "--samples", "2", "--concurrency", "2"])
    assert server.max_in_flight == 2


def test_failed_requests_are_retried_as_often_as_asked(capsys):
    calls = {"n": 0}
    answer = answers_half(6)

    def flaky(path: str, body: dict):
        calls["n"] += 1
        return (503, {"Retry-After": "0"}, b"{}") if calls["n"] % 2 else answer(path, body)

    with ScriptedServer(flaky) as server:
        summary = run_json(capsys, ["eval", *ARITH, "--policy", server.url, "--max-retries", "1",
                                    "--concurrency", "1"])
    assert summary["success"] == 0.5 and calls["n"] == 12  # each of the 6 answers came on its second try


def test_a_server_that_keeps_failing_is_one_line(capsys):
    with ScriptedServer(lambda path, body: (503, {"Retry-After": "0"}, b"{}")) as server:
        assert main(["eval", *ARITH, "--policy", server.url, "--max-retries", "0"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "fix: " in errors[0]  # the progress lines go on stderr too
    assert server.url in errors[0] and "every one of the 6 episodes" in errors[0]


def test_one_failing_episode_in_five_leaves_the_other_four_scored(capsys, tmp_path):
    """The server answers every task but one, for which it fails every try: that episode is an error, reward 0,
    counted and shown; the eval finishes and writes every row."""
    answer = answers_half(5)
    env = make_env("trace/Arithmetic-v0", n_tasks=5)
    doomed = env.unwrapped.tasks[2].prompt
    env.close()

    def one_fails(path: str, body: dict):
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return (502, {}, b'{"error": "upstream down"}') if question == doomed else answer(path, body)

    with ScriptedServer(one_fails) as server:
        summary = run_json(capsys, ["eval", "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=5", "--policy",
                                    server.url, "--max-retries", "1", "--out", str(tmp_path / "out")])
    # tasks 0 and 4 right of the 4 scored: the server's failure is not the model's
    assert (summary["episodes"], summary["scored"], summary["errors"], summary["success"]) == (5, 4, 1, 0.5)
    assert "upstream down" in summary["first_error"] and summary["infra"]["server_error"] == 1
    rows = rows_of(tmp_path / "out" / "rows.jsonl")
    assert len(rows) == 5 and [r["error"] is not None for r in rows] == [False, False, True, False, False]
    assert rows[2]["success"] is None and rows[2]["stop_reason"] == "server_error"


def test_the_api_key_comes_from_the_named_variable(capsys, monkeypatch):
    monkeypatch.setenv("MY_EVAL_KEY", "sk-named")
    with ScriptedServer(answers_half(6)) as server:
        run_json(capsys, ["eval", *ARITH, "--policy", server.url, "--api-key-env", "MY_EVAL_KEY"])
    assert {r["headers"].get("Authorization") for r in server.requests if r["body"]} == {"Bearer sk-named"}
    monkeypatch.delenv("MY_EVAL_KEY")
    assert "MY_EVAL_KEY" in user_error(capsys, ["eval", *ARITH, "--policy", server.url,
                                                "--api-key-env", "MY_EVAL_KEY"])


# ----------------------------------------------------------------------------- the progress bar


def run_on_a_terminal(argv: list[str]) -> str:
    """The command's output with its stdout and stderr on a pseudo-terminal, as a user sees it."""
    leader, follower = os.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    env.pop("FORCE_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "trace_gym.training.cli", *argv], stdout=follower, stderr=follower,
                            cwd=ROOT, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the follower side closed: the command is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=600) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def test_a_terminal_shows_a_progress_bar_over_the_episodes():
    out = run_on_a_terminal(["eval", *ARITH, "--policy", "expert", "--samples", "2"])
    assert "eval episodes" in out and "12/12" in out and "95% interval" in out


def test_json_output_on_a_terminal_has_no_progress_bar():
    out = run_on_a_terminal(["eval", *ARITH, "--policy", "expert", "--json"])
    assert "eval episodes" not in out and "\x1b[" not in out  # plain JSON, even on a terminal
    assert json.loads(out)["episodes"] == 6


def test_output_to_a_pipe_gets_plain_progress_lines_on_stderr():
    result = subprocess.run([sys.executable, "-m", "trace_gym.training.cli.main", "eval", *ARITH, "--policy", "expert"],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0 and "eval episodes 6/6 100% | " in result.stderr
    assert "episode/s" in result.stderr and "elapsed" in result.stderr
    assert "\x1b[" not in result.stdout + result.stderr and "95% interval" in result.stdout
    assert "eval episodes" not in result.stdout  # the command's output stays the table


# ----------------------------------------------------------------------------- mistakes, one line each


@pytest.mark.parametrize(("argv", "expected"), [
    (["--policy", "no-such-model"], "expected a policy spec"),
    (["--policy", "expert", "--base-url", "http://127.0.0.1:9/v1"], "expected --base-url only with a server"),
    (["--policy", "expert", "--dtype", "float32"], "--dtype only with a model folder (hf:PATH) or vllm:PATH"),
    (["--policy", "expert:2"], "expected expert noise in [0, 1]"),
    (["--policy", "expert", "--tasks", "-1"], "expected --tasks >= 0"),
    (["--policy", "expert", "--samples", "0"], "expected --samples >= 1"),
    (["--policy", "expert", "--env-arg", "n_tasks"], "expected --env-arg KEY=VALUE"),
    (["--policy", "expert", "--env-arg", "n_taks=3"], "did you mean n_tasks?"),
    (["--policy", "expert", "--trees"], "expected --out DIR with --trees"),
    (["--policy", "expert", "--trees", "--out", "x.jsonl"], "expected a folder --out with --trees"),
    (["--policy", "openai:m", "--model", "other", "--base-url", "http://127.0.0.1:9/v1"], "one model name"),
    (["--policy", "expert", "--checkpoint", "runs/x"], "got both (--checkpoint)"),
    (["--policy", "expert", "eval.tasks=3"], "--env-arg KEY=VALUE"),
    (["--policy", "expert", "--env-arg", "max_turns=four"], "expected max_turns of trace/Arithmetic-v0 to be an "
                                                            "integer, got 'four'"),
    (["--policy", "expert", "--env-arg", "max_turns=true"], "to be an integer, got True"),
    (["--policy", "expert", "--env-arg", "action_format=json"], "one of 'tags', 'hermes'"),
    (["--policy", "expert", "--env-arg", "data_path=/nope.jsonl"], "expected no data_path for trace/Arithmetic-v0"),
])
def test_a_bad_flag_or_spec_is_one_line(capsys, argv, expected):
    assert expected in user_error(capsys, ["eval", *ARITH, *argv])


def test_eval_help_names_only_options_that_eval_has(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    assert "--ray-ranks" not in text and "--checkpoint" in text and "--tool-calls" in text and "--resume" in text


def test_eval_rows_carry_each_samples_answer_and_stop_reason(capsys, tmp_path):
    run_json(capsys, ["eval", *ARITH, "--env-arg", "max_turns=1", "--policy", "expert:0.5", "--samples", "2",
                      "--out", str(tmp_path / "rows.jsonl")])
    rows = rows_of(tmp_path / "rows.jsonl")
    assert len(rows) == 12 and all(r["answer"] and r["stop_reason"] for r in rows)
    # one turn: the expert's first turn is its tool call, so every episode stops at the turn limit with that text
    assert all(r["answer"].startswith("<python>") for r in rows)
    assert {r["stop_reason"] for r in rows} == {"max_turns"}


def test_an_unknown_env_is_one_line_naming_the_nearest(capsys):
    assert "did you mean 'trace/Arithmetic-v0'" in user_error(
        capsys, ["eval", "--env", "trace/Arithmatic-v0", "--policy", "expert"])


def test_a_policy_without_an_env_says_so(capsys):
    assert "expected --env SPEC" in user_error(capsys, ["eval", "--policy", "expert"])


def test_an_openai_spec_without_a_base_url_says_where_to_give_one(capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert "OPENAI_BASE_URL" in user_error(capsys, ["eval", *ARITH, "--policy", "openai:m"])


def test_a_policy_flag_with_a_checkpoint_is_one_line(capsys, tmp_path):
    line = user_error(capsys, ["eval", "--checkpoint", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1"])
    assert "got both (--base-url)" in line
