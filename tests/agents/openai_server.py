"""A real OpenAI-compatible HTTP server on 127.0.0.1 for the HTTP backend's tests: it answers from a script
of responses the test sets, and records every request (path, body, headers) and the most requests it
had in flight at once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, str], bytes]


def completion(text: str = "<answer>4</answer>", token_ids: tuple[int, ...] = (7, 8)) -> Reply:
    """A /completions answer with vLLM's token-id strings and a logprob per token."""
    body = {"choices": [{"text": text, "finish_reason": "stop", "logprobs": {
        "tokens": [f"token_id:{t}" for t in token_ids], "token_logprobs": [-0.5] * len(token_ids)}}]}
    return 200, {}, json.dumps(body).encode()


def chat(text: str = "<answer>4</answer>") -> Reply:
    body = {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                         "logprobs": {"content": [{"token": "x", "logprob": -0.1}]}}]}
    return 200, {}, json.dumps(body).encode()


class ScriptedServer:
    """``server.url`` ends in /v1. ``script(path, body) -> Reply`` decides each answer (default: success);
    ``hold`` seconds are spent inside each request so that concurrent ones overlap."""

    def __init__(self, script: Callable[[str, dict[str, Any]], Reply] | None = None, hold: float = 0.0,
                 models: tuple[str, ...] = ("served-model",)):
        self.script = script or (lambda path, body: chat() if path.endswith("/chat/completions") else completion())
        self.hold, self.models = hold, models
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                outer._record(self, {})
                self._send(200, {}, json.dumps({"data": [{"id": m} for m in outer.models]}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    outer._record(self, body)
                    time.sleep(outer.hold)
                    self._send(*outer.script(self.path, body))
                finally:
                    with outer._lock:
                        outer.in_flight -= 1

            def _send(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _record(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append({"path": handler.path, "body": body, "headers": dict(handler.headers)})

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
