"""A real OpenAI-compatible HTTP server on 127.0.0.1 for the HTTP backend's tests: it answers from a script
of responses the test sets, and records every request (path, body, headers) and the most requests it
had in flight at once; its model list names an owner (``owned_by="vllm"`` looks like a vLLM server).
``mode="reasoning"`` refuses requests as OpenAI's hosted reasoning models (o-series, gpt-5) do (`reasoning_refusal`)
before the script sees them.
`ExpertScript` answers as an env's scripted expert would, the OpenAI way (``tool_calls``, a plain final answer),
with tagged answers, or as text."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

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


def message_reply(message: dict[str, Any], finish_reason: str = "stop",
                  token_ids: tuple[int, ...] | None = None) -> Reply:
    """A /chat/completions answer holding ``message``; with ``token_ids``, vLLM's token-id logprob strings."""
    content = [{"token": f"token_id:{t}", "logprob": -0.25, "bytes": None, "top_logprobs": []}
               for t in token_ids] if token_ids else [{"token": "x", "logprob": -0.1, "bytes": None,
                                                       "top_logprobs": []}]
    body = {"id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                         "logprobs": {"content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(content), "total_tokens": 1 + len(content)}}
    return 200, {}, json.dumps(body).encode()


def openai_error(param: str, code: str, message: str) -> Reply:
    """An HTTP 400 in the OpenAI API's error form."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return 400, {}, json.dumps({"error": error}).encode()


def reasoning_refusal(body: dict[str, Any]) -> Reply | None:
    """The refusal OpenAI's reasoning models give ``body``, else None: one field at a time, as the API reports
    them (``max_tokens``, ``logprobs`` and ``top_logprobs`` are unsupported parameters; a temperature or top_p
    other than 1 an unsupported value)."""
    if "max_tokens" in body:
        return openai_error("max_tokens", "unsupported_parameter", "Unsupported parameter: 'max_tokens' is not "
                            "supported with this model. Use 'max_completion_tokens' instead.")
    for field in ("logprobs", "top_logprobs"):
        if field in body:
            return openai_error(field, "unsupported_parameter",
                                f"Unsupported parameter: '{field}' is not supported with this model.")
    for field in ("temperature", "top_p"):
        if field in body and body[field] != 1:
            return openai_error(field, "unsupported_value", f"Unsupported value: '{field}' does not support "
                                f"{body[field]} with this model. Only the default (1) value is supported.")
    return None


class ExpertScript:
    """A server script that plays an env's scripted expert (``env.expert(noise, seed)``, seeded with the
    request's seed) on the conversation it is sent: ``shape="openai"`` answers as the OpenAI API and hosted models
    do, a call as ``message.tool_calls`` with ``content: null`` and the final answer as a plain message (no tags);
    ``"tools"`` the same but the final answer in the env's answer tags; ``"text"`` every turn as the env's action
    text in ``content``. Tasks are found by their prompt (the first user message)."""

    def __init__(self, make_env: Callable[[], Any], shape: Literal["openai", "tools", "text"], noise: float = 0.0):
        probe = make_env()
        base = probe.unwrapped
        self.tasks = {t.prompt: t for t in base.tasks}
        self.parser, self.tool_map, self.expert = base.parser, dict(base.tool_map), base.expert
        probe.close()
        self.shape, self.noise = shape, noise
        self._ids = itertools.count()

    def __call__(self, path: str, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        task = self.tasks[next(m["content"] for m in messages if m["role"] == "user")]
        text = self.expert(noise=self.noise, seed=int(body.get("seed", 0))).act(task, messages)
        parsed = self.parser.parse(text, self.tool_map)
        calls = parsed.calls
        if self.shape == "openai" and parsed.answer is not None:
            return message_reply({"role": "assistant", "content": parsed.answer})
        if self.shape == "text" or not calls:
            return message_reply({"role": "assistant", "content": text})
        tool_calls = [{"id": f"chatcmpl-tool-{next(self._ids)}", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
        return message_reply({"role": "assistant", "content": None, "tool_calls": tool_calls}, "tool_calls")


def _unasked(reply: Reply, body: dict[str, Any]) -> Reply:
    """``reply`` without log-probabilities when the request asked for none (``logprobs: null``, as the API does)."""
    status, headers, data = reply
    if status != 200 or body.get("logprobs"):
        return reply
    try:
        answer = json.loads(data)
    except ValueError:
        return reply
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        return reply
    for choice in answer["choices"]:
        if isinstance(choice, dict) and "logprobs" in choice:
            choice["logprobs"] = None
    return status, headers, json.dumps(answer).encode()


class ScriptedServer:
    """``server.url`` ends in /v1. ``script(path, body) -> Reply`` decides each answer (default: success);
    ``hold`` seconds are spent inside each request so that concurrent ones overlap."""

    def __init__(self, script: Callable[[str, dict[str, Any]], Reply] | None = None, hold: float = 0.0,
                 models: tuple[str, ...] = ("served-model",), owned_by: str = "openai",
                 mode: Literal["open", "reasoning"] = "open"):
        self.script = script or (lambda path, body: chat() if path.endswith("/chat/completions") else completion())
        self.hold, self.models, self.owned_by, self.mode = hold, models, owned_by, mode
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                outer._record(self, {})
                models = [{"id": m, "object": "model", "owned_by": outer.owned_by} for m in outer.models]
                self._send(200, {}, json.dumps({"object": "list", "data": models}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    outer._record(self, body)
                    time.sleep(outer.hold)
                    refused = reasoning_refusal(body) if outer.mode == "reasoning" else None
                    reply = refused or _unasked(outer.script(self.path, body), body)
                finally:
                    # Counted out before the answer goes: once the client has read it, it may send the next
                    # request before this thread would get past a later decrement.
                    with outer._lock:
                        outer.in_flight -= 1
                self._send(*reply)

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
