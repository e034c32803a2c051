"""The env server over real HTTP and WebSocket on localhost: OpenEnv's routes and payloads (its own validator
and client against a running server), episodes played by text, branches from snapshot handles that replay
exactly, and every mistake an answer with a fix, never a dead server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.training.parity_env import ENTRY_POINT
from trace_gym.env_specs import make_env
from trace_gym.errors import ConfigError, ServerError
from trace_gym.integrations.env_client import EnvClient
from trace_gym.integrations.env_server import EnvServer, ServeLimits

ARITH = ("trace/Arithmetic-v0", {"n_tasks": 4})


@pytest.fixture()
def server():
    with EnvServer(*ARITH) as running:
        yield running


@pytest.fixture()
def client(server):
    with EnvClient(server.url) as c:
        yield c


def expert_call(obs_task_prompt: str) -> str:
    expression = obs_task_prompt.removeprefix("Compute ").removesuffix(".")
    return f"<python>print({expression})</python>"


def test_an_episode_over_http_scores_like_in_process(client):
    env = client.open()
    obs, info = env.reset(index=0)
    assert info["messages"][-1] == {"role": "user", "content": obs} and env.tools[0]["function"]["name"] == "python"
    _, reward, terminated, _, out = env.step(expert_call(obs))
    value = out["messages"][0]["content"].strip()
    assert not terminated and out["messages"][0]["role"] == "tool" and out["turn"] == 1
    _, reward, terminated, _, out = env.step(f"<answer>{value}</answer>")
    assert (reward, terminated, out["done"], out["info"]["stop_reason"]) == (1.0, True, True, "answer")
    state = env.state()
    assert (state["step_count"], state["done"], state["task_id"]) == (2, True, "arith-0")
    with pytest.raises(ServerError, match=r"HTTP 400.*ended; fix: reset"):
        env.step("<answer>1</answer>")
    env.close()


def test_branches_from_a_snapshot_are_independent_and_replay_exactly(client, server):
    env = client.open()
    obs, _ = env.reset(index=1)
    env.step(expert_call(obs))
    handle = env.snapshot()
    right = env.step("<answer>" + env.messages()[-1]["content"].strip() + "</answer>")
    env.restore(handle)
    wrong = env.step("<answer>-1</answer>")
    env.restore(handle)
    again = env.step("<answer>" + env.messages()[-1]["content"].strip() + "</answer>")
    assert (right[1], wrong[1]) == (1.0, 0.0) and again[1:4] == right[1:4]
    branch = env.branch(handle)  # a second session at the same turn, played while the first waits
    assert branch.session != env.session and branch.messages() == env.messages()[:-1]
    assert branch.step("<answer>" + branch.messages()[-1]["content"].strip() + "</answer>")[1] == 1.0
    assert server.budget.used == 3  # two sessions and one handle
    env.release(handle)
    with pytest.raises(ServerError, match="snapshot handle"):
        env.restore(handle)
    branch.close()
    env.close()
    assert (server.sessions, server.budget.used) == (0, 0)


def test_sessions_run_in_parallel_and_a_users_own_env_is_served():
    results: dict[int, float] = {}
    with EnvServer(ENTRY_POINT, {"n_tasks": 3}) as server, EnvClient(server.url) as client:
        def play(i: int) -> None:
            env = client.open()
            env.reset(index=i)
            env.step("hello")
            results[i] = env.step("even" if i % 2 == 0 else "odd")[1]
            env.close()

        threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0} and server.sessions == 0


def test_a_malformed_action_is_the_envs_error_observation(client):
    env = client.open()
    env.reset(index=0)
    obs, reward, terminated, _, out = env.step("<python>print(1")
    assert obs.startswith("Error:") and reward == 0 and not terminated and out["info"]["error"]


@pytest.mark.parametrize(("method", "path", "body", "status", "expected"), [
    ("POST", "/reset", {"task_id": "arith-99"}, 400, "expected a task id of this dataset"),
    ("POST", "/reset", {"index": "four"}, 422, "int_parsing"),
    ("POST", "/step", {"action": {"message": "x"}}, 400, "expected an X-Session-Id header"),
    ("POST", "/step", {"action": "x"}, 422, "model_attributes_type"),
    ("GET", "/state", None, 400, "fix: POST /reset opens one"),
    ("POST", "/restore", {"snapshot": "s0"}, 400, "X-Session-Id"),
    ("GET", "/nowhere", None, 404, "Not Found"),
])
def test_mistakes_are_answers_with_a_fix(client, method, path, body, status, expected):
    resp = client.http.request(method, path, json=body)
    assert resp.status_code == status and expected in json.dumps(resp.json()["detail"])
    assert client.health() == {"status": "healthy"}  # the server lives on


def test_a_handle_of_a_started_episode_only_and_a_stale_one_is_a_400(client):
    env = client.open()
    env.reset(index=0)
    with pytest.raises(ServerError, match=r"HTTP 400.*expected a snapshot handle of this EnvSession"):
        env.restore("s404")
    with pytest.raises(ServerError, match="HTTP 400"):
        env.release("s404")


def test_trace_gym_serve_runs_the_server_and_refuses_a_spec_that_is_not_an_env(tmp_path):
    command = str(Path(sys.executable).parent / "trace-gym")
    refused = subprocess.run([command, "serve", "--env", "os:system"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.startswith("error: expected os:system to name a trace_gym")
    port = _free_port()
    proc = subprocess.Popen([command, "serve", "--env", ENTRY_POINT, "--env-args", '{"n_tasks": 2}', "--port",
                             str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=_root())
    try:
        client = EnvClient(f"http://127.0.0.1:{port}")
        _wait_up(client, proc)
        env = client.open()
        env.reset(index=0)
        assert env.step("a")[2] is False and env.step("ab")[1] == 1.0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_openenv_validate_passes_against_a_running_server(server):
    pytest.importorskip("openenv")
    openenv = Path(sys.executable).parent / "openenv"
    result = subprocess.run([str(openenv), "validate", "--url", server.url, "--json"], capture_output=True,
                            text=True, timeout=120)
    report = json.loads(result.stdout)
    failed = [c for c in report["criteria"] if not c["passed"]]
    assert result.returncode == 0 and report["passed"] and report["mode"] == "simulation", failed
    assert {c["id"] for c in report["criteria"]} >= {"health_endpoint", "metadata_endpoint", "schema_endpoint",
                                                     "mcp_endpoint", "mode_endpoint_consistency"}


def test_openenvs_generic_client_plays_a_whole_episode_with_the_expert(server):
    """OpenEnv's client over the WebSocket, unchanged; the actions are the env's scripted expert's."""
    openenv = pytest.importorskip("openenv")
    local = make_env(*ARITH[:1], **ARITH[1]).unwrapped  # the same tasks, for the expert's gold answers
    expert = local.expert()
    for index in range(2):
        with openenv.GenericEnvClient(base_url=server.url).sync() as env:
            result = env.reset(index=index, episode_id=f"ep{index}")
            chat = list(result.observation["messages"])
            task = local.task_by_id(result.observation["task_id"])
            while not result.done:
                action = expert.act(task, chat)
                result = env.step({"message": action})
                chat += [{"role": "assistant", "content": action}, *result.observation["messages"]]
            state = env.state()
            assert result.reward == 1.0 and state["episode_id"] == f"ep{index}" and state["step_count"] == 2
            assert state["messages"][2:] == chat[2:] and server.sessions == 1
        deadline = time.monotonic() + 30
        while server.sessions and time.monotonic() < deadline:  # a connection's session closes with it
            time.sleep(0.05)
        assert server.sessions == 0
    local.close()


def test_the_websocket_keeps_branching_and_answers_mistakes(server):
    pytest.importorskip("websockets")
    from websockets.sync.client import connect

    def ask(ws, message):
        ws.send(json.dumps(message))
        return json.loads(ws.recv(timeout=60))

    with connect(server.url.replace("http", "ws") + "/ws") as ws:
        first = ask(ws, {"type": "reset", "data": {"index": 0}})["data"]["observation"]
        tool = ask(ws, {"type": "step", "data": {"message": expert_call(first["text"])}})["data"]
        handle = ask(ws, {"type": "snapshot"})["data"]["snapshot"]
        value = tool["observation"]["text"].strip()
        right = ask(ws, {"type": "step", "data": {"message": f"<answer>{value}</answer>"}})["data"]
        back = ask(ws, {"type": "restore", "data": {"snapshot": handle}})["data"]
        wrong = ask(ws, {"type": "step", "data": {"message": "<answer>0</answer>"}})["data"]
        assert (right["reward"], wrong["reward"], back["done"]) == (1.0, 0.0, False)
        assert ask(ws, {"type": "release", "data": {"snapshot": handle}})["type"] == "released"
        assert ask(ws, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        ws.send("{nope")
        assert json.loads(ws.recv(timeout=60))["data"]["code"] == "INVALID_JSON"
        assert ask(ws, {"type": "step", "data": {"text": "x"}})["data"]["code"] == "VALIDATION_ERROR"
        tools = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})["data"]
        assert tools["result"]["tools"][0]["name"] == "python"


def test_mcp_lists_the_envs_tools_and_runs_none_outside_a_turn(client):
    listed = client.http.post("/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).json()
    assert listed["id"] == 7 and listed["result"]["tools"][0]["inputSchema"]["properties"]["code"]
    called = client.http.post("/mcp", json={"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                                            "params": {"name": "python", "arguments": {"code": "print(1)"}}}).json()
    assert called["error"]["code"] == -32601 and "inside an episode's turn" in called["error"]["message"]


def test_an_unused_session_closes_after_its_idle_time():
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, limits=ServeLimits(session_idle_s=1.0)) as server, \
            EnvClient(server.url) as client:
        env = client.open()
        env.reset(index=0)
        deadline = time.monotonic() + 30
        while server.sessions and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.sessions == 0 and server.budget.used == 0
        with pytest.raises(ServerError, match=r"HTTP 404.*expected an open session of yours"):
            env.step("a")


def test_the_served_env_and_its_arguments_fail_at_start_up_with_their_fix():
    with pytest.raises(ConfigError, match="did you mean 'trace/Arithmetic-v0'"):
        EnvServer("trace/Arithmatic-v0")
    with pytest.raises(ConfigError, match="to be an integer"):
        EnvServer("trace/Arithmetic-v0", {"max_turns": "four"})


def test_a_missing_serve_extra_is_one_line_naming_what_to_install(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "fastapi.py").write_text("raise ImportError('no fastapi here', name='fastapi')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{_root()}"}
    result = subprocess.run([sys.executable, "-c", "import trace_gym.integrations.env_server"], capture_output=True,
                            text=True, env=env, timeout=120)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and "fix: pip install -e '.[serve]'" in last and "fastapi" in last


def _root() -> str:
    return str(Path(__file__).resolve().parents[3])


def _wait_up(client: EnvClient, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            client.health()
            return
        except ServerError:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_keeps_a_connection_alive_across_turns(client):
    env = client.open()
    env.reset(index=0)
    with httpx.Client(base_url=client.url) as other:  # one connection, several requests
        assert other.get("/health").json() == {"status": "healthy"}
        assert other.get("/metadata").json()["name"] == "trace/Arithmetic-v0"
        assert set(other.get("/schema").json()) == {"action", "observation", "state"}


@pytest.mark.slow
def test_a_sessions_sandbox_outlives_the_request_threads_that_ran_it(client):
    """Requests run on the server's worker threads, and a worker idle for 10 s ends (anyio's pool): two
    sessions run their first cells at once (two workers), sit idle past that, and run their next cells after
    the older worker has ended; both sandboxes still answer."""
    envs = [client.open() for _ in range(2)]
    prompts = [env.reset(index=i)[0] for i, env in enumerate(envs)]
    barrier = threading.Barrier(2)
    first: dict[int, str] = {}

    def cell(i: int) -> None:
        barrier.wait()
        first[i] = envs[i].step(expert_call(prompts[i]))[0]

    threads = [threading.Thread(target=cell, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(11)
    envs[0].state()  # a request to the pool: the worker idle longest is ended now
    later = [env.step("<python>print(6 * 7)</python>")[0] for env in envs]
    assert all(not text.startswith("Crashed") for text in [*first.values(), *later]), later
    assert later == ["42\n", "42\n"]
