"""The env server over real HTTP on localhost: sessions of any env spec, episodes played by text, and branches
from snapshot handles that replay exactly; every mistake an answer with a fix, never a dead server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.training.parity_env import ENTRY_POINT
from trace_gym.errors import ServerError
from trace_gym.integrations.env_server import EnvClient, EnvServer

ARITH = ("trace/Arithmetic-v0", {"n_tasks": 4})


@pytest.fixture()
def client():
    with EnvServer(port=0) as server:
        yield EnvClient(server.url)


def expert_call(obs_task_prompt: str) -> str:
    expression = obs_task_prompt.removeprefix("Compute ").removesuffix(".")
    return f"<python>print({expression})</python>"


def test_an_episode_over_http_scores_like_in_process(client):
    env = client.open(*ARITH)
    obs, info = env.reset(index=0)
    assert info["messages"][-1] == {"role": "user", "content": obs} and env.tools[0]["function"]["name"] == "python"
    _, reward, terminated, _, out = env.step(expert_call(obs))
    value = out["new_messages"][0]["content"].strip()
    assert not terminated and out["new_messages"][0]["role"] == "tool"
    _, reward, terminated, _, out = env.step(f"<answer>{value}</answer>")
    assert (reward, terminated, out["info"]["stop_reason"]) == (1.0, True, "answer")
    env.close()


def test_branches_from_a_snapshot_are_independent_and_replay_exactly(client):
    env = client.open(*ARITH)
    obs, _ = env.reset(index=1)
    env.step(expert_call(obs))
    handle = env.snapshot()
    right = env.step("<answer>" + env.messages()[-1]["content"].strip() + "</answer>")
    env.restore(handle)
    wrong = env.step("<answer>-1</answer>")
    env.restore(handle)
    again = env.step("<answer>" + env.messages()[-1]["content"].strip() + "</answer>")
    assert (right[1], wrong[1]) == (1.0, 0.0) and again[1:4] == right[1:4]
    env.release(handle)
    with pytest.raises(ServerError, match="snapshot handle"):
        env.restore(handle)


def test_sessions_run_in_parallel_and_a_users_own_env_is_served(client):
    results: dict[int, float] = {}

    def play(i: int) -> None:
        env = client.open(ENTRY_POINT, {"n_tasks": 3})
        env.reset(index=i)
        env.step("hello")
        results[i] = env.step("even" if i % 2 == 0 else "odd")[1]
        env.close()

    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0} and client.health()["sessions"] == 0


def test_a_malformed_action_is_the_envs_error_observation(client):
    env = client.open(*ARITH)
    env.reset(index=0)
    obs, reward, terminated, _, out = env.step("<python>print(1")
    assert obs.startswith("Error:") and reward == 0 and not terminated and out["info"]["error"]


@pytest.mark.parametrize(("method", "path", "body", "status", "expected"), [
    ("POST", "/sessions", {"env": "trace/Arithmatic-v0"}, 400, "did you mean 'trace/Arithmetic-v0'"),
    ("POST", "/sessions", {"env": "trace/Arithmetic-v0", "env_args": {"max_turns": "four"}}, 400,
     "to be an integer"),
    ("POST", "/sessions", {"env_args": []}, 400, "fix: e.g."),
    ("POST", "/sessions/e99/step", {"action": "x"}, 404, "expected an open session"),
    ("GET", "/nowhere", None, 404, "GET /health"),
])
def test_mistakes_are_answers_with_a_fix(client, method, path, body, status, expected):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(client.url + path, data=data, method=method)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(req, timeout=30)
    assert caught.value.code == status and expected in json.loads(caught.value.read())["error"]
    assert client.health()["ok"]  # the server lives on


def test_a_body_that_is_not_json_is_refused():
    with EnvServer(port=0) as server:
        req = urllib.request.Request(server.url + "/sessions", data=b"{nope", method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=30)
        assert caught.value.code == 400 and "expected a JSON body" in caught.value.read().decode()


def test_the_module_runs_as_a_server_process():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trace_gym.integrations.env_server", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = EnvClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.health()
                break
            except ServerError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)
        env = client.open(ENTRY_POINT, {"n_tasks": 2})
        env.reset(index=0)
        assert env.step("a")[2] is False and env.step("ab")[1] == 1.0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
