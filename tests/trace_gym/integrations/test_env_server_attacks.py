"""The env server from an attacker's side: every request below is what a hostile client, or a web page open in
a browser on the machine, can send; each layer of the defence is tested on its own (raw sockets where a client
library would tidy the request up)."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.training.parity_env import ENTRY_POINT, ParityEnv
from trace_gym.errors import ConfigError
from trace_gym.integrations.env_client import EnvClient
from trace_gym.integrations.env_server import MAX_BODY, EnvServer, ServeLimits
from trace_gym.integrations.serve_budget import host_budget, unit_footprint
from trace_gym.integrations.serve_guard import MAX_JSON_ITEMS, json_items
from trace_gym.limits import Footprint, HostNeeds, available_memory, check_host

TOKEN_A, TOKEN_B = "a" * 24 + "-token-of-alice", "b" * 24 + "-token-of-bob"


@pytest.fixture()
def server():
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}) as running:
        yield running


def raw(url: str, request: bytes, read_s: float = 10.0) -> bytes:
    """Send ``request`` as is on a new connection; what the server answered before closing or ``read_s``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=read_s) as sock:
        sock.sendall(request)
        return _read_all(sock, read_s)


def _read_all(sock: socket.socket, read_s: float) -> bytes:
    data, deadline = b"", time.monotonic() + read_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


def post(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}",
             "Connection: close", "", ""]
    return raw(url, "\r\n".join(lines).encode() + body)


def local_host(url: str) -> str:
    return url.removeprefix("http://")


# ----------------------------------------------------------------------------------------------- code and paths
def test_an_operator_spec_that_is_not_an_env_class_is_refused_before_it_is_called(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("TRACE_GYM_TEST_MARKER", str(marker))
    for spec in ("os:system", "subprocess:getoutput", "subprocess:Popen",
                 "tests.trace_gym.integrations.serve_attack_env:leave_marker",
                 "tests.trace_gym.integrations.serve_attack_env:NotAnEnv"):
        with pytest.raises(ConfigError, match="to name a trace_gym env class"):
            EnvServer(spec, {"command": f"touch {marker}", "args": ["touch", str(marker)]})
    assert not marker.exists()


def test_a_client_cannot_name_code_to_run(server, tmp_path):
    marker = tmp_path / "pwned"
    spec = {"env": "os:system", "env_args": {"command": f"touch {marker}"}}
    answers = [post(server.url, path, json.dumps(spec).encode(), {"Host": local_host(server.url),
                                                                  "Content-Type": "application/json"})
               for path in ("/sessions", "/reset", "/reset?env=os:system")]
    assert [status_of(a) for a in answers] == [404, 422, 422]
    ws = _ws_exchange(server.url, {"type": "reset", "data": spec})
    assert ws["type"] == "error" and ws["data"]["code"] == "VALIDATION_ERROR"
    assert not marker.exists() and _sessions_after_closing(server) == 0


def test_a_client_cannot_point_the_env_at_a_file(server, tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"problem": "SECRET-LINE-7f3a", "answer": "1"}) + "\n")
    secret.chmod(0o600)
    attempts = [("/sessions", {"env": "trace/Math-v0", "env_args": {"data_path": str(secret)}}),
                ("/reset", {"data_path": str(secret)}),
                ("/reset", {"env_args": {"data_path": str(secret)}, "index": 0})]
    answers = [post(server.url, path, json.dumps(body).encode(), {"Host": local_host(server.url),
                                                                  "Content-Type": "application/json"})
               for path, body in attempts]
    ws = _ws_exchange(server.url, {"type": "reset", "data": {"data_path": str(secret)}})
    assert [status_of(a) for a in answers] == [404, 422, 422] and ws["data"]["code"] == "VALIDATION_ERROR"
    assert not any(b"SECRET-LINE" in a for a in answers) and "SECRET-LINE" not in json.dumps(ws)


# ----------------------------------------------------------------------------------------------- web pages
def test_a_browsers_simple_request_with_a_foreign_host_is_refused(server):
    """What a page on evil.example sends after rebinding its name to 127.0.0.1: text/plain, its Host, its
    Origin. Nothing runs."""
    answer = post(server.url, "/reset", b'{"index": 0}', {"Host": "evil.example:8765",
                                                          "Origin": "http://evil.example:8765",
                                                          "Content-Type": "text/plain"})
    assert status_of(answer) == 421 and server.sessions == 0


@pytest.mark.parametrize(("headers", "status", "says"), [
    ({"Host": "evil.example"}, 421, b"expected Host"),  # rebinding: the attacker's name
    ({"Host": "10.1.2.3:80"}, 421, b"expected Host"),  # another address than the bound one
    ({"Host": "127.0.0.1:80@evil.example"}, 421, b"expected Host"),  # not a name and a port: a userinfo form
    ({"Host": "[localhost]evil.example"}, 421, b"expected Host"),  # text after the brackets
    ({"Host": "[127.0.0.1]"}, 421, b"expected Host"),  # brackets hold an IPv6 address only
    ({"Origin": "http://evil.example"}, 403, b"expected no Origin"),  # a cross-origin fetch
    ({"Origin": "null"}, 403, b"expected no Origin"),  # a sandboxed frame or a file: page
    ({"Content-Type": "text/plain"}, 415, b"expected Content-Type application/json"),  # a CORS simple request
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, b"application/json"),  # a form
    ({"Content-Type": ""}, 415, b"application/json"),
])
def test_each_browser_layer_is_refused_on_its_own(server, headers, status, says):
    base = {"Host": local_host(server.url), "Content-Type": "application/json"}
    answer = post(server.url, "/reset", b'{"index": 0}', {**base, **headers})
    assert status_of(answer) == status and says in answer and server.sessions == 0


def test_a_websocket_from_a_page_is_refused_before_it_opens(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as caught:
        connect(server.url.replace("http", "ws") + "/ws", origin="http://evil.example")  # type: ignore[arg-type]
    assert caught.value.response.status_code == 403 and server.sessions == 0
    rebound = raw(server.url, b"GET /ws HTTP/1.1\r\nHost: evil.example\r\nUpgrade: websocket\r\nConnection: Upgrade"
                              b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert status_of(rebound) == 421 and server.sessions == 0


def test_loopback_names_and_ipv6_literals_are_the_bound_address(server):
    for host in (local_host(server.url), "localhost:1234", "[::1]:9"):  # any port: tunnels keep working
        answer = raw(server.url, f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        assert status_of(answer) == 200, answer


# ----------------------------------------------------------------------------------------------- tokens
def test_a_token_is_required_to_bind_anything_but_loopback():
    with pytest.raises(ConfigError, match=r"expected a token to bind 0\.0\.0\.0"):
        EnvServer(ENTRY_POINT, host="0.0.0.0")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        EnvServer(ENTRY_POINT, tokens=["short"])


def test_a_server_with_tokens_answers_only_requests_that_present_one():
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A, TOKEN_B]) as server:
        health = f"{server.url}/health"
        assert httpx.get(health).status_code == 401
        assert httpx.get(health, headers={"Authorization": "Bearer " + TOKEN_A[:-1] + "x"}).status_code == 401
        assert httpx.get(health, headers={"Authorization": "Token " + TOKEN_A}).status_code == 401
        assert httpx.get(health, headers={"Authorization": "Bearer " + TOKEN_A}).status_code == 200
        basic = base64.b64encode(f"anyone:{TOKEN_B}".encode()).decode()
        assert httpx.get(health, headers={"Authorization": "Basic " + basic}).status_code == 200
        with pytest.raises(Exception, match="401"):
            _ws_exchange(server.url, {"type": "state"})
        # OpenEnv's client sends no header of its own: the token rides in the URL's user info (Basic).
        ws = _ws_exchange(server.url.replace("://", f"://client:{TOKEN_A}@"), {"type": "reset", "data": {}})
        assert ws["type"] == "observation"
        if importlib.util.find_spec("openenv") is not None:  # OpenEnv's validator, with the token and without
            openenv = str(Path(sys.executable).parent / "openenv")
            reports = [json.loads(subprocess.run([openenv, "validate", "--url", url, "--json"], capture_output=True,
                                                 text=True, timeout=120).stdout)
                       for url in (server.url.replace("://", f"://client:{TOKEN_B}@"), server.url)]
            assert [r["passed"] for r in reports] == [True, False]


# ----------------------------------------------------------------------------------------------- sessions
def test_sessions_have_unguessable_ids_and_belong_to_the_token_that_opened_them():
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A, TOKEN_B]) as server:
        alice, bob = EnvClient(server.url, TOKEN_A).open(), EnvClient(server.url, TOKEN_B)
        alice.reset(index=0)
        other = EnvClient(server.url, TOKEN_A).open()
        other.reset(index=0)
        assert alice.session is not None and len(alice.session) >= 32 and alice.session != other.session
        for sid in [alice.session, "e0", "e1", "s0", "1", alice.session[:-1]]:
            for method, path, body in (("POST", "/step", {"action": {"message": "x"}}), ("GET", "/state", None),
                                       ("POST", "/reset", {}), ("POST", "/snapshot", {}), ("POST", "/close", {})):
                resp = bob.http.request(method, path, json=body, headers={"X-Session-Id": sid})
                assert resp.status_code == 404, (sid, path, resp.text)
        assert alice.step("hello")[0].startswith("noted") and alice.state()["step_count"] == 1
        assert server.sessions == 2


def test_without_tokens_a_session_is_reached_only_by_its_id(server):
    victim = EnvClient(server.url).open()
    victim.reset(index=0)
    attacker = httpx.Client(base_url=server.url)
    for guess in ["e0", "e1", "e2", "0", "1", "session-0"]:
        assert attacker.get("/state", headers={"X-Session-Id": guess}).status_code == 404
        assert attacker.post("/close", json={}, headers={"X-Session-Id": guess}).status_code == 404
    assert victim.step("hello")[0].startswith("noted") and server.sessions == 1
    assert b"X-Session" not in attacker.get("/health").content + attacker.get("/metadata").content


# ----------------------------------------------------------------------------------------------- framing
def test_a_negative_content_length_is_refused_without_reading_the_body(server):
    host, port = local_host(server.url).rsplit(":", 1)
    head = (f"POST /reset HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: -1\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        try:
            for _ in range(48):  # 48 MiB offered; the server answers and closes long before
                sock.sendall(b"x" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_all(sock, 10)
    assert status_of(answer) == 400 and server.sessions == 0
    assert httpx.get(server.url + "/health").json() == {"status": "healthy"}


@pytest.mark.parametrize(("length_headers", "status"), [
    ("Content-Length: 17000000\r\n", 413),  # over the body bound: refused before a byte of it is read
    (f"Content-Length: {MAX_BODY + 1}\r\n", 413),  # the env's actions are 32,000 characters: 1 MiB is the bound
    ("Transfer-Encoding: chunked\r\n", 411),  # no length at all
    ("Content-Length: 5\r\nContent-Length: 50\r\n", 400),  # two lengths
    ("Content-Length: 0x10\r\n", 400),
])
def test_a_body_must_declare_one_honest_length(server, length_headers, status):
    head = (f"POST /reset HTTP/1.1\r\nHost: {local_host(server.url)}\r\nContent-Type: application/json\r\n"
            f"{length_headers}Connection: close\r\n\r\n").encode()
    assert status_of(raw(server.url, head)) == status and server.sessions == 0


@pytest.mark.parametrize("payload", [
    b"[" + b"{}," * (MAX_BODY // 3 - 100) + b"{}]",  # 800 MiB of dicts per 16 MiB, parsed on the event loop
    b"[" + b"1," * (MAX_BODY // 2 - 100) + b"1]",
    b"[" + b'"",' * (MAX_BODY // 3 - 100) + b'""]',
    b"[" * 20_000 + b"]" * 20_000,  # nesting past the parser's recursion
])
def test_a_body_of_many_small_values_is_refused_before_it_is_parsed(server, payload):
    body = b'{"action": {"message": "x", "metadata": {"k": ' + payload + b"}}}"
    assert len(body) <= MAX_BODY
    answer = post(server.url, "/reset", body, {"Host": local_host(server.url), "Content-Type": "application/json"})
    assert status_of(answer) == 413 and b"strings, containers and items" in answer and server.sessions == 0
    ws = _ws_exchange(server.url, None, raw_message=payload.decode())
    assert ws["type"] == "error" and "strings, containers and items" in ws["data"]["message"]
    assert _sessions_after_closing(server) == 0
    env = EnvClient(server.url).open()  # a turn's body passes, its text full of brackets and quotes
    env.reset(index=0)
    assert env.step('{[",' * 7_000)[0]


def test_a_refused_field_is_not_echoed_back_whole(server):
    body = json.dumps({"index": 0, "data_path": "x" * 500_000}).encode()
    answer = post(server.url, "/reset", body, {"Host": local_host(server.url), "Content-Type": "application/json"})
    assert status_of(answer) == 422 and b"extra_forbidden" in answer and len(answer) < 2_000


def test_items_are_counted_outside_strings_and_in_one_pass():
    # three braces, four strings (one holding brackets, commas and an escaped quote), one comma
    assert json_items(b'{"action": {"message": "a, {b} [c] \\" ,", "metadata": {}}}') == 8
    assert json_items(b"[" * (MAX_JSON_ITEMS + 5), MAX_JSON_ITEMS) == MAX_JSON_ITEMS + 1
    # An unterminated string, or one ending in a lone backslash, is one token to the end: each scan moves on,
    # so a body of escaped quotes is counted in one pass, not one per quote.
    assert json_items(b'"' + b'\\"' * (MAX_BODY // 2)) == 1 and json_items(b'"abc\\') == 1
    assert json_items(b'"\\' * (MAX_BODY // 2)) == 1


def test_half_sent_requests_are_timed_out():
    """Admitted connections (their headers in) that never finish the body: 408 once the request timeout passes;
    then the server serves as before."""
    limits = ServeLimits(request_timeout_s=1.0, admit_timeout_s=60.0)
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, limits=limits) as server:
        host, port = local_host(server.url).rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(6)]
        for sock in socks:
            sock.sendall(b"POST /reset HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Length: 9\r\n"
                         b"Content-Type: application/json\r\n\r\n{\"ind")
        answers = [_read_all(sock, 20) for sock in socks]
        for sock in socks:
            sock.close()
        assert {status_of(a) for a in answers} == {408} and all(b"whole request" in a for a in answers)
        _wait_for_no_connections(server)
        env = EnvClient(server.url).open()
        assert env.reset(index=0)[0].startswith("Say something")


# ----------------------------------------------------------------------------------------------- connections
# A flood from the attacker's side, one layer at a time. Every address of 127.0.0.0/8 reaches a loopback server, so
# a socket bound to 127.0.0.2 is another peer than the token holder's 127.0.0.1.
def _connect(server: EnvServer, source: str = "127.0.0.1") -> socket.socket:
    host, port = local_host(server.url).rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    return sock


def _health(server: EnvServer, sock: socket.socket, token: str | None = TOKEN_A) -> int:
    """GET /health on ``sock`` (kept alive): the answer's status, 0 when the server closed it instead."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    try:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {local_host(server.url)}\r\n{auth}\r\n".encode())
        sock.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return status_of(answer)
    except OSError:
        return 0


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _closed_with(sock: socket.socket, read_s: float = 30.0) -> bytes:
    """What the server sent before closing ``sock`` (it must close it within ``read_s``)."""
    answer = _read_all(sock, read_s)
    sock.settimeout(read_s)
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b""  # closed (a timeout here: still open)
    return answer


def _wait_for_no_connections(server: EnvServer) -> None:
    deadline = time.monotonic() + 30
    while (server.connections.total or server.server.server_state.connections) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.connections.total == 0 and not server.server.server_state.connections


def test_a_connection_without_a_valid_request_is_closed_at_the_admission_deadline():
    """Sending nothing, trickling a valid request's headers, or sending headers without the token: each holds its
    socket for the admission deadline at most, far under the request timeout; an admitted connection outlives
    it, idle between kept-alive requests."""
    limits = ServeLimits(admit_timeout_s=1.0, request_timeout_s=600.0)
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A], limits=limits) as server:
        silent, trickle, tokenless, client = (_connect(server) for _ in range(4))
        assert _health(server, client) == 200
        trickle.sendall(b"GET /health HTTP/1.1\r\nHo")
        tokenless.sendall(f"GET /health HTTP/1.1\r\nHost: {local_host(server.url)}\r\n\r\n".encode())
        assert status_of(_closed_with(silent)) == 408
        assert status_of(_closed_with(trickle)) == 408
        assert status_of(_closed_with(tokenless)) == 401  # refused and closed at once
        assert _health(server, client) == 200  # admitted: the deadline has passed, it stays
        assert b"valid request" in _closed_with(_connect(server))
        client.close()
        _wait_for_no_connections(server)


def test_an_admitted_websocket_outlives_the_admission_deadline_and_gives_its_room_back():
    from websockets.sync.client import connect

    limits = ServeLimits(admit_timeout_s=0.5)
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A], limits=limits) as server:
        url = server.url.replace("http://", f"ws://client:{TOKEN_A}@") + "/ws"
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            assert _closed_with(_connect(server), 30).startswith(b"HTTP/1.1 408")  # the deadline has passed
            ws.send(json.dumps({"type": "state"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "state"
            assert server.connections.total == 1 and not server.connections.waiting
        _wait_for_no_connections(server)


def test_one_peer_holds_only_a_few_connections_that_wait_and_its_newest_stays():
    """An address past its waiting connections loses its oldest one, never another address's; its own newest
    stays, so a client behind the same address (this machine, a NAT) whose request is on its way gets in."""
    limits = ServeLimits(admit_timeout_s=600.0, max_waiting_per_peer=4)
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A], limits=limits) as server:
        other = _connect(server, "127.0.0.3")  # another peer waiting: untouched by the flood below
        flood = [_connect(server, "127.0.0.2") for _ in range(4)]
        _until(lambda: server.connections.total == 5)
        newcomer = _connect(server, "127.0.0.2")
        answer = _closed_with(flood[0])
        assert status_of(answer) == 503 and b"at most 4 connections from one address may wait" in answer
        assert _health(server, newcomer) == 200  # the newest of the flooding address, admitted
        assert _health(server, other) == 200
        more = [_connect(server, "127.0.0.2") for _ in range(4)]  # the flood goes on: its own oldest go
        assert [status_of(_closed_with(s)) for s in flood[1:]] == [503, 503, 503]
        assert _health(server, newcomer) == 200 and server.connections.total == 2 + 4
        for sock in [other, newcomer, *more]:
            sock.close()
        _wait_for_no_connections(server)


def test_one_peer_cannot_take_more_than_its_share_of_connections():
    """An address holding its share of admitted connections is refused one more; another address is not."""
    limits = ServeLimits(admit_timeout_s=600.0, max_per_peer=3)
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A], limits=limits) as server:
        held = [_connect(server, "127.0.0.2") for _ in range(3)]
        assert [_health(server, s) for s in held] == [200, 200, 200]
        answer = _closed_with(_connect(server, "127.0.0.2"))
        assert status_of(answer) == 503 and b"at most 3 connections from one address" in answer
        assert _health(server, _connect(server)) == 200
        assert [_health(server, s) for s in held] == [200, 200, 200]  # the admitted ones are never closed for it
        for sock in held:
            sock.close()


def test_waiting_connections_from_many_peers_leave_room_for_admitted_ones():
    """Peers each under their own bound together hold at most the room for waiting connections (8 of 12 here):
    the reserved 4 stay for admitted ones. A token holder's connections get in beside the flood, and admitted
    connections can take the whole server, displacing waiting ones, never displaced themselves."""
    limits = ServeLimits(admit_timeout_s=600.0, request_timeout_s=600.0, max_connections=12, reserved_connections=4,
                         max_per_peer=12, max_waiting_per_peer=2)
    with EnvServer(ENTRY_POINT, {"n_tasks": 2}, tokens=[TOKEN_A], limits=limits) as server:
        table = server.connections
        flood = [_connect(server, f"127.0.0.{10 + i // 2}") for i in range(10)]  # five peers, two each
        answer = _closed_with(flood[0])
        assert status_of(answer) == 503 and b"at most 8 connections may wait" in answer
        _until(lambda: table.total == 8 and len(table.waiting) == 8)
        clients = _admitted(server, 4)
        flood += [_connect(server, f"127.0.0.{20 + i // 2}") for i in range(6)]  # the flood goes on
        _until(lambda: table.total == 12 and len(table.waiting) == 8)
        assert [_health(server, s) for s in clients] == [200] * 4
        clients += _admitted(server, 8)
        assert table.total == 12 and not table.waiting
        assert {status_of(_closed_with(s)) for s in flood[1:]} == {503}  # every flooding socket closed
        full = _closed_with(_connect(server, "127.0.0.30"))
        assert status_of(full) == 503 and b"all in use by clients that sent a valid request" in full
        assert [_health(server, s) for s in clients] == [200] * 12
        for sock in clients:
            sock.close()


def _admitted(server: EnvServer, count: int) -> list[socket.socket]:
    """``count`` connections of the token holder, each admitted by a request as soon as it opens."""
    out = []
    for _ in range(count):
        out.append(_connect(server))
        assert _health(server, out[-1]) == 200
    return out


def _until(condition: Callable[[], bool]) -> None:
    """Wait for the server's event loop to catch up with what this side did (30 s at most)."""
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


# ----------------------------------------------------------------------------------------------- the budget
class HeavyParityEnv(ParityEnv):
    """ParityEnv declaring that each live unit costs a twentieth of this host's available memory."""

    @staticmethod
    def host_footprint(branching: bool) -> Footprint:
        return Footprint(processes=2.0, descriptors=2.0, namespaces=1.0,
                         memory_bytes=(available_memory() or 1 << 34) // 20)


HEAVY = f"{__name__}:HeavyParityEnv"


def test_the_live_budget_fits_the_host():
    """The sandboxed env's budget: every OS limit passes and the units take at most half the available memory;
    one more unit than the budget of the memory alone would not fit."""
    from trace_gym.environments.math.env import ArithmeticEnv

    footprint = unit_footprint(ArithmeticEnv)
    budget = host_budget(footprint, connections=256)
    needs = HostNeeds.of(budget, footprint)
    assert 0 < budget < 65_536 and not check_host(needs)
    assert budget * footprint.memory_bytes <= 0.5 * (available_memory() or 0)


def test_one_client_cannot_hold_more_sessions_and_snapshots_than_the_host_budget():
    with EnvServer(HEAVY, {"n_tasks": 2}) as server:
        limit = server.budget.limit
        assert 5 <= limit <= 10  # half of twenty shares of the memory
        first = EnvClient(server.url).open()
        first.reset(index=0)
        first.step("hello")
        handles = []
        for _ in range(limit - 1):
            handles.append(first.snapshot())
        refused = first.client.http.post("/snapshot", json={}, headers={"X-Session-Id": first.session})
        assert refused.status_code == 503 and f"at most {limit} live sessions" in refused.json()["detail"]
        assert httpx.post(server.url + "/reset", json={}).status_code == 503  # a new session neither
        assert _ws_exchange(server.url, None)["data"]["code"] == "CAPACITY_REACHED"
        first.release(handles.pop())
        second = EnvClient(server.url).open()
        assert second.reset(index=1)[0].startswith("Say something")  # the released unit, taken again
        assert server.budget.used == limit
        first.close()
        second.close()
        assert server.budget.used == 0
    with pytest.raises(ConfigError, match="expected max_live at most"):
        EnvServer(HEAVY, limits=ServeLimits(max_live=10_000))


# ----------------------------------------------------------------------------------------------- answer checks
def test_another_clients_costly_answers_cannot_fail_a_step(tmp_path, monkeypatch):
    """One token's checks hold every answer checker and more of its sessions queue; another token's correct
    answer gets the next free checker, ahead of them. A check that gets no checker in time is answered 200 as
    the env's infrastructure failure ("infra_error"), never a 500 and never the answer's 0."""
    from trace_gym.environments.math import jailed
    from trace_gym.fairness import Client
    from trace_gym.integrations.serve_guard import token_owner

    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"problem": "Write 1/sqrt(2) another way.", "answer": "\\frac{\\sqrt{2}}{2}"}) + "\n")
    answer = "\\boxed{\\frac{1}{\\sqrt{2}}}"
    env_args = {"dataset": "math500", "data_path": str(data)}
    with EnvServer("trace/Math-v0", env_args, tokens=[TOKEN_A, TOKEN_B]) as server:
        jailed.start_checker()
        pool = jailed._pool("jail", "nobody")
        hog = Client(token_owner(TOKEN_A), "held")
        held = [pool.acquire(hog) for _ in range(len(pool.checkers))]
        alice = [EnvClient(server.url, TOKEN_A).open() for _ in range(2)]
        bob = EnvClient(server.url, TOKEN_B).open()
        for env in [*alice, bob]:
            env.reset(index=0)
        finished: list[str] = []
        served: list[str] = []  # owners in the order the pool handed them a checker
        pop = pool.waiting.pop

        def recording_pop():
            client, ticket = pop()
            served.append(client.owner)
            return client, ticket

        monkeypatch.setattr(pool.waiting, "pop", recording_pop)

        def play(env, name: str) -> None:
            assert env.step(answer)[1] == 1.0
            finished.append(name)

        threads = [threading.Thread(target=play, args=(env, f"alice{i}")) for i, env in enumerate(alice)]
        for thread in threads:
            thread.start()
        _until(lambda: len(pool.waiting) == 2)
        threads.append(threading.Thread(target=play, args=(bob, "bob")))
        threads[-1].start()
        _until(lambda: len(pool.waiting) == 3)
        pool.release(held.pop(), hog)  # one checker goes round
        for thread in threads:
            thread.join(timeout=300)
        # the order of service, not of the replies: a reply can reach its thread after the next check has ended
        assert served == [token_owner(TOKEN_B), token_owner(TOKEN_A), token_owner(TOKEN_A)]
        assert sorted(finished) == ["alice0", "alice1", "bob"]
        held.append(pool.acquire(hog))
        monkeypatch.setattr(jailed, "QUEUE_WAIT_S", 0.3)
        try:
            bob.reset(index=0)
            _, reward, terminated, truncated, obs = bob.step(answer)
        finally:
            for checker in held:
                pool.release(checker, hog)
        assert (reward, terminated, truncated, obs["info"]["stop_reason"]) == (0.0, False, True, "infra_error")
        assert "free answer checker" in obs["info"]["error"]
        bob.reset(index=0)
        assert bob.step(answer)[1] == 1.0


# ----------------------------------------------------------------------------------------------- the command line
def test_the_command_refuses_a_token_file_others_can_read(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN_A + "\n")
    tokens.chmod(0o644)
    result = subprocess.run([sys.executable, "-m", "trace_gym.training.cli", "serve", "--env", ENTRY_POINT,
                             "--token-file", str(tokens)], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[3],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert result.returncode != 0 and f"fix: chmod 600 {tokens}" in result.stderr


def _sessions_after_closing(server: EnvServer) -> int:
    """The server's open sessions once a WebSocket that just ended has closed its own (the server sees the
    connection end after the client does)."""
    deadline = time.monotonic() + 30
    while server.sessions and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.sessions


def _ws_exchange(url: str, message: dict | None, raw_message: str | None = None) -> dict:
    """One message (or ``raw_message`` as is) over a new WebSocket session (neither: only what the server says
    first, if anything)."""
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws", 1) + "/ws", open_timeout=30, max_size=None) as ws:
        if message is not None or raw_message is not None:
            ws.send(raw_message if raw_message is not None else json.dumps(message))
        return json.loads(ws.recv(timeout=30))
