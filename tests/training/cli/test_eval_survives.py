"""Evaluations that survive, against the OpenAI-compatible HTTP server on 127.0.0.1 (tests/agents/openai_server.py)
playing Arithmetic's scripted expert: a server killed mid-eval leaves the finished episodes' rows and `eval
--resume` plays the rest without replaying them; Ctrl-C (SIGINT to a real `trace-gym eval` process) keeps what
finished and says how to go on; episodes the server failed are never scored."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.agents.openai_server import ExpertScript, ScriptedServer
from trace_gym.env_specs import env_factory
from trace_gym.training.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
TASKS = 20

# A server process: the test server playing the noiseless expert, bound to PORT, each request's task and whether
# it is an episode's first turn appended to LOG. Killed with SIGKILL, it leaves the client nothing to read.
SERVER = """
import json, sys, time
import tests.agents.openai_server as served
from trace_gym.env_specs import env_factory

port, log, hold = int(sys.argv[1]), open(sys.argv[2], "a"), float(sys.argv[3])
bound = served.ThreadingHTTPServer
served.ThreadingHTTPServer = lambda address, handler: bound(("127.0.0.1", port), handler)
expert = served.ExpertScript(env_factory("trace/Arithmetic-v0", {"n_tasks": N_TASKS}), "text")

def script(path, body):
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    first = not any(m["role"] == "assistant" for m in body["messages"])
    log.write(json.dumps({"task": expert.tasks[user].id, "first": first}) + "\\n")
    log.flush()
    return expert(path, body)

with served.ScriptedServer(script, hold=hold):
    print("ready", flush=True)
    while True:
        time.sleep(1)
""".replace("N_TASKS", str(TASKS))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, log: Path, hold: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(log), str(hold)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def eval_argv(url: str, out: Path) -> list[str]:
    return ["eval", "--env", "trace/Arithmetic-v0", "--env-arg", f"n_tasks={TASKS}", "--policy", "openai:m",
            "--base-url", url, "--server", "openai", "--tool-calls", "text", "--tasks", str(TASKS),
            "--concurrency", "2", "--max-retries", "0", "--out", str(out), "--json"]


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_rows(path: Path, n: int, proc: subprocess.Popen, limit: float = 120.0) -> None:
    """Until ``path`` holds ``n`` whole rows (a deadline only so that a broken run fails instead of hanging)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"expected {n} rows in {path} while the eval runs, got "
                         f"{path.read_text().count(chr(10)) if path.is_file() else 0}")


def first_turns(log: Path) -> list[str]:
    return [r["task"] for r in rows_of(log) if r["first"]] if log.is_file() else []


def test_a_server_killed_mid_eval_leaves_the_finished_rows_and_resume_plays_only_the_rest(tmp_path, capsys):
    port, out = free_port(), tmp_path / "out"
    url = f"http://127.0.0.1:{port}/v1"
    server = start_server(port, tmp_path / "before.log", hold=0.2)
    run = subprocess.Popen([sys.executable, "-m", "trace_gym.training.cli.main", *eval_argv(url, out)], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_rows(out / "rows.jsonl", 4, run)
        server.send_signal(signal.SIGKILL)
        server.wait()
        _, err = run.communicate(timeout=300)
    finally:
        for p in (server, run):
            if p.poll() is None:
                p.kill()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert run.returncode == 2 and len(errors) == 1, err[-2000:]
    assert "in a row ended on a failed request" in errors[0] and "--resume" in errors[0]
    rows = rows_of(out / "rows.jsonl")
    kept = {r["task_id"] for r in rows if r["stop_reason"] != "server_error"}
    assert len(kept) >= 4 and all(r["success"] == 1.0 for r in rows if r["task_id"] in kept)
    assert all(r["success"] is None for r in rows if r["stop_reason"] == "server_error")  # never scored

    server = start_server(port, tmp_path / "after.log", hold=0.0)  # back, at the same address
    try:
        assert main([*eval_argv(url, out), "--resume"]) == 0
    finally:
        server.kill()
        server.wait()
    summary = json.loads(capsys.readouterr().out)
    assert not set(first_turns(tmp_path / "after.log")) & kept  # no finished episode played again
    assert sorted(first_turns(tmp_path / "after.log")) == sorted(t.id for t in tasks() if t.id not in kept)
    final = rows_of(out / "rows.jsonl")
    assert [r["task_id"] for r in final] == [t.id for t in tasks()] and all(r["success"] == 1.0 for r in final)
    assert (summary["episodes"], summary["scored"], summary["errors"], summary["success"]) == (TASKS, TASKS, 0, 1.0)


def test_resume_with_other_settings_is_one_line(tmp_path, capsys):
    with ScriptedServer(ExpertScript(env_factory("trace/Arithmetic-v0", {"n_tasks": TASKS}), "text")) as server:
        assert main([*eval_argv(server.url, tmp_path / "out"), "--tasks", "3"]) == 0
        assert main([*eval_argv(server.url, tmp_path / "out"), "--tasks", "3", "--temperature", "0.7",
                     "--resume"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "fix: " in errors[0]
    assert "got temperature=0.7 where it ran with temperature=0.0" in errors[0]


def test_ctrl_c_keeps_the_finished_episodes_and_says_how_to_resume(tmp_path, capsys):
    out = tmp_path / "out"
    with ScriptedServer(ExpertScript(env_factory("trace/Arithmetic-v0", {"n_tasks": TASKS}), "text"),
                        hold=0.2) as server:
        argv = [a for a in eval_argv(server.url, out) if a != "--json"]  # progress lines on stderr
        # a test run started in the background of a shell without job control inherits SIGINT ignored: the eval
        # gets the default disposition a terminal gives it
        run = subprocess.Popen([sys.executable, "-m", "trace_gym.training.cli.main", *argv], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TRACE_GYM_PROGRESS_INTERVAL": "0"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            wait_for_rows(out / "rows.jsonl", 3, run)
            run.send_signal(signal.SIGINT)
            _, err = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 130, err[-2000:]
        said = [line for line in err.splitlines() if "interrupted" in line]
        kept = rows_of(out / "rows.jsonl")
        assert len(said) == 1 and f"{len(kept)} finished episodes kept in {out / 'rows.jsonl'}" in said[0]
        assert "--resume" in said[0] and len(kept) >= 3 and all(r["success"] == 1.0 for r in kept)
        # progress lines on stderr count episodes as they end, not only at the end
        assert any(line.startswith("eval episodes ") and f"/{TASKS}" in line for line in err.splitlines())
        asked = len(server.requests)
        assert main([*eval_argv(server.url, out), "--resume"]) == 0
        resumed = [r["body"] for r in server.requests[asked:] if r["body"]]
    firsts = {next(m["content"] for m in b["messages"] if m["role"] == "user") for b in resumed
              if not any(m["role"] == "assistant" for m in b["messages"])}
    prompts = {t.id: t.prompt for t in tasks()}
    assert not firsts & {prompts[r["task_id"]] for r in kept}  # none of the kept episodes played again
    assert len(rows_of(out / "rows.jsonl")) == TASKS and json.loads(capsys.readouterr().out)["success"] == 1.0


def tasks() -> list:
    return env_factory("trace/Arithmetic-v0", {"n_tasks": TASKS}).tasks()


def test_rollout_resume_keeps_the_trees_written_and_plays_the_other_tasks(tmp_path, capsys):
    """A rollout's unit is a task's tree: the trees on file are kept as they are (a line cut short by a kill is
    dropped), the other tasks play, and the result is the uninterrupted run's."""
    argv = ["rollout", "--env", "trace/Arithmetic-v0", "--env-arg", "n_tasks=5", "--tasks", "5", "--samples", "2",
            "--branches", "1", "--json"]
    assert main([*argv, "--out", str(tmp_path / "whole.jsonl")]) == 0
    whole = (tmp_path / "whole.jsonl").read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    assert main([*argv, "--out", str(cut)]) == 0
    cut.write_text("\n".join(whole[:2]) + "\n" + whole[2][:40])  # two trees, and a third cut mid-line
    assert main([*argv, "--out", str(cut), "--resume"]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n}\n")[-2] + "\n}")
    again = cut.read_text().splitlines()
    assert again[:2] == whole[:2] and sorted(again) == sorted(whole) and summary["episodes"] == 15
