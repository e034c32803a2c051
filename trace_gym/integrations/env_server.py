"""An HTTP server of env sessions, so that a trainer in any process (any language) plays trace-gym envs and
branches their episodes: snapshot a turn, restore it as often as it likes, each branch independent.

    python -m trace_gym.integrations.env_server --port 8765          # 127.0.0.1 by default

=========================================  ==============================================================
request (JSON body)                        answer (JSON)
=========================================  ==============================================================
``POST /sessions {env, env_args}``         ``{session, tools}``: a new env (any env spec)
``POST /sessions/ID/reset {task_id}``      ``{observation, messages, task_id, tools}`` (or ``index``/``seed``)
``POST /sessions/ID/step {action}``        ``{observation, reward, terminated, truncated, done, new_messages,
                                           info}``
``POST /sessions/ID/snapshot``             ``{snapshot}``: a handle to the episode now
``POST /sessions/ID/restore {snapshot}``   ``{observation, messages, task_id, done}``
``POST /sessions/ID/release {snapshot}``   ``{}``
``DELETE /sessions/ID``                    ``{}``: the env closed, its snapshots released
``GET /health``                            ``{ok, sessions}``
=========================================  ==============================================================

A user's mistake (an unknown env or task, a bad handle) is HTTP 400 with ``{"error": "expected ..., got ...;
fix: ..."}``; an unknown session is 404; a bug is 500 with the exception's one line. Model output is never an
error: a malformed action is the env's error observation, as in-process. `EnvClient` is the standard-library
client. The server binds the loopback address unless told otherwise: it runs code the envs run (their
sandboxes), so it must not face a network it does not trust.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trace_gym.errors import ConfigError, ServerError, UserError
from trace_gym.integrations.session import EnvSession

__all__ = ["EnvClient", "EnvServer", "RemoteEnv"]

MAX_BODY = 16 * 1024 * 1024  # an action longer than this is not a turn


class EnvServer:
    """``with EnvServer(port=0) as server: server.url`` serves sessions on a thread; ``serve_forever()`` in the
    foreground. At most ``max_sessions`` envs are open at once."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_sessions: int = 64):
        self.max_sessions = max_sessions
        self.sessions: dict[str, tuple[EnvSession, threading.Lock]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # requests are not worth a line each
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/health":
                    self._send(200, {"ok": True, "sessions": len(outer.sessions)})
                else:
                    self._send(404, {"error": f"expected GET /health, got GET {self.path}"})

            def do_POST(self) -> None:
                self._answer("POST")

            def do_DELETE(self) -> None:
                self._answer("DELETE")

            def _answer(self, method: str) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY:
                        raise ConfigError(f"expected a request body of at most {MAX_BODY} bytes, got {length}")
                    raw = self.rfile.read(length) if length else b"{}"
                    try:
                        body = json.loads(raw or b"{}")
                    except json.JSONDecodeError as exc:
                        raise ConfigError(f"expected a JSON body, got {raw[:80]!r} ({exc})") from None
                    if not isinstance(body, dict):
                        raise ConfigError(f"expected a JSON object as the body, got {type(body).__name__}")
                    self._send(200, outer.route(method, self.path, body))
                except KeyError as exc:
                    self._send(404, {"error": str(exc.args[0]) if exc.args else "not found"})
                except UserError as exc:
                    self._send(400, {"error": " ".join(str(exc).split())})
                except Exception as exc:  # a bug in an env or here: its one line, and the server lives on
                    self._send(500, {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:1000]}"})

            def _send(self, status: int, payload: Mapping[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread: threading.Thread | None = None

    def route(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request (the module docstring's table); raises what the handler maps to a status."""
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts == ["sessions"] and method == "POST":
            return self._open(body)
        if len(parts) < 2 or parts[0] != "sessions":
            raise ConfigError(f"expected /sessions or /sessions/ID/VERB, got {method} {path}")
        sid = parts[1]
        with self._lock:
            if sid not in self.sessions:
                raise KeyError(f"expected an open session, got {sid!r}; fix: POST /sessions to open one")
            session, lock = self.sessions[sid]
        verb = parts[2] if len(parts) > 2 else None
        if method == "DELETE" and verb is None:
            with self._lock:
                self.sessions.pop(sid, None)
            with lock:
                session.close()
            return {}
        with lock:  # one request at a time per env; sessions run in parallel
            if verb == "reset":
                return session.reset(body.get("task_id"), body.get("index"), body.get("seed"))
            if verb == "step":
                return session.step(body.get("action"))  # type: ignore[arg-type]
            if verb == "snapshot":
                return {"snapshot": session.snapshot()}
            if verb == "restore":
                return session.restore(str(body.get("snapshot")))
            if verb == "release":
                session.release(str(body.get("snapshot")))
                return {}
            if verb == "messages":
                return {"messages": session.messages()}
        raise ConfigError(f"expected a verb of reset, step, snapshot, restore, release or messages, got {method} "
                          f"{path}")

    def _open(self, body: dict[str, Any]) -> dict[str, Any]:
        spec, env_args = body.get("env"), body.get("env_args") or {}
        if not isinstance(spec, str) or not isinstance(env_args, dict):
            raise ConfigError(f"expected {{'env': SPEC, 'env_args': {{...}}}}, got {json.dumps(body)[:200]}; fix: "
                              "e.g. {'env': 'trace/Arithmetic-v0', 'env_args': {'n_tasks': 10}}")
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                raise ConfigError(f"expected at most {self.max_sessions} open sessions, got one more; fix: DELETE "
                                  "the sessions you are done with")
            sid = f"e{next(self._ids)}"
        session = EnvSession(spec, env_args)
        with self._lock:
            self.sessions[sid] = (session, threading.Lock())
        return {"session": sid, "tools": session.tools}

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        """Stop serving and close every session's env."""
        with self._lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for session, lock in sessions:
            with lock:
                session.close()
        self.httpd.server_close()

    def __enter__(self) -> EnvServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.close()


class EnvClient:
    """The standard-library client of an `EnvServer` at ``url``: ``client.open(spec, env_args)`` is a
    `RemoteEnv`. A refused request raises `ServerError` with the server's message."""

    def __init__(self, url: str, timeout: float = 300.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def open(self, spec: str, env_args: Mapping[str, Any] | None = None) -> RemoteEnv:
        out = self.request("POST", "/sessions", {"env": spec, "env_args": dict(env_args or {})})
        return RemoteEnv(self, out["session"], out["tools"])

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(dict(body or {})).encode() if method != "GET" else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", "")
            except (json.JSONDecodeError, AttributeError):
                message = ""
            raise ServerError(f"expected an answer from the env server at {self.url}, got HTTP {exc.code} for "
                              f"{method} {path}: {message}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise ServerError(f"expected the env server at {self.url}, got {getattr(exc, 'reason', exc)}; fix: start "
                              "it: python -m trace_gym.integrations.env_server --port PORT") from None


class RemoteEnv:
    """One session of an env server, used like the env: ``reset``, ``step`` (gymnasium's 5-tuple), and
    ``snapshot``/``restore``/``release`` by handle."""

    def __init__(self, client: EnvClient, session: str, tools: list[dict[str, Any]]):
        self.client, self.session, self.tools = client, session, tools

    def reset(self, task_id: str | None = None, index: int | None = None, seed: int | None = None
              ) -> tuple[str, dict[str, Any]]:
        out = self._post("reset", {"task_id": task_id, "index": index, "seed": seed})
        return out["observation"], out

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        out = self._post("step", {"action": action})
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out

    def snapshot(self) -> str:
        return self._post("snapshot", {})["snapshot"]

    def restore(self, handle: str) -> tuple[str, dict[str, Any]]:
        out = self._post("restore", {"snapshot": handle})
        return out["observation"], out

    def release(self, handle: str) -> None:
        self._post("release", {"snapshot": handle})

    def messages(self) -> list[dict[str, Any]]:
        return self._post("messages", {})["messages"]

    def close(self) -> None:
        self.client.request("DELETE", f"/sessions/{self.session}")

    def _post(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.request("POST", f"/sessions/{self.session}/{verb}", body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trace_gym.integrations.env_server",
                                     description="serve trace-gym env sessions over HTTP (module docstring)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--max-sessions", type=int, default=64)
    args = parser.parse_args(argv)
    server = EnvServer(args.host, args.port, args.max_sessions)
    print(f"trace-gym env server at {server.url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
