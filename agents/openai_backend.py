"""OpenAI-compatible HTTP backend (a `vllm serve` or SGLang server the user runs), standard library only.

Token-id prompts (and message prompts when a local tokenizer is given) go to `/v1/completions` with the ids
as the prompt: the model writes its tool calls as text and the env parses them. Message prompts otherwise go to
`/v1/chat/completions`. There, with ``tool_calls="native"`` and the env's `ToolFormat` (`policy_from_spec`
reads it from the env), the request carries the env's tool schemas as ``tools``, the history goes in the
OpenAI form (assistant ``tool_calls``, results with their ``tool_call_id``) and an answer's
``message.tool_calls`` become the env's action text (agents/native_tools.py); with ``tool_calls="text"`` the
messages go as the env wrote them and the answer's ``content`` is the action. An answer with neither content
nor tool calls, or tool calls the policy has no format for, raises `ServerError`: it is never read as an
empty turn. With
`server="vllm"` the request asks for `return_tokens_as_token_ids`, so generations carry exact token ids, and
passes vLLM's extra sampling fields (top_k, min_tokens, include_stop_str_in_output). Each (request, sample)
pair is one HTTP call with its own seed; at most `concurrency` calls are in flight at once, over all threads
that share the policy (a trainer's env workers, several evaluations). Transient failures (connection errors,
timeouts, 408/429/5xx) are retried with exponential backoff and jitter, waiting at least as long as a
`Retry-After` header asks (capped at `max_wait`); other failures and malformed responses raise `ServerError`
at once, with the server's message.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from trace_gym.agents.chat import encode, render_prompt
from trace_gym.agents.native_tools import ToolFormat
from trace_gym.agents.policy import Generation, Request, SamplingParams, row_seed
from trace_gym.errors import ConfigError, ServerError

__all__ = ["RETRY_STATUS", "OpenAIPolicy", "ServerError"]

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIPolicy:
    """`Policy` over an OpenAI-compatible server at `base_url` (e.g. "http://127.0.0.1:8000/v1")."""

    def __init__(self, base_url: str, model: str, tokenizer=None, api_key: str | None = None,
                 server: Literal["vllm", "openai"] = "vllm", timeout: float = 120.0, max_retries: int = 5,
                 backoff: float = 0.5, concurrency: int = 16, max_wait: float = 60.0,
                 tool_calls: Literal["native", "text"] = "native", tool_format: ToolFormat | None = None):
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ConfigError(f"expected concurrency >= 1, max_retries >= 0, timeout > 0, got {concurrency}, "
                              f"{max_retries}, {timeout}")
        if tool_calls not in ("native", "text"):
            raise ConfigError(f"expected tool_calls 'native' or 'text', got {tool_calls!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.api_key = api_key
        self.server = server
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.concurrency = concurrency
        self.max_wait = max_wait
        self.tool_calls = tool_calls
        self.tool_format = tool_format
        """The env's tools and action parser, for native tool calls (`ToolFormat.of_env(env)`)."""
        self._slots = threading.BoundedSemaphore(concurrency)  # the in-flight limit, shared by every caller

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        """Sample ``sampling.n`` continuations of every request (the ``Policy`` contract), one HTTP call each."""
        keys = [(i, j) for i in range(len(requests)) for j in range(sampling.n)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(len(keys), 1))) as pool:
            return list(pool.map(lambda key: self._one(requests[key[0]], sampling, *key), keys))

    def _one(self, req: Request, sampling: SamplingParams, i: int, j: int) -> Generation:
        body: dict[str, Any] = {"model": self.model, "n": 1, "temperature": sampling.temperature,
                                "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens}
        seed = row_seed(req, sampling, i, j)
        if seed is not None:
            body["seed"] = seed % (2**31)
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if self.server == "vllm":
            body.update(top_k=sampling.top_k or -1, min_tokens=sampling.min_new_tokens,
                        include_stop_str_in_output=sampling.include_stop_str_in_output,
                        return_tokens_as_token_ids=True, skip_special_tokens=True)
        prompt_ids = list(req.prompt_ids) if req.prompt_ids is not None else None
        if prompt_ids is None and self.tokenizer is not None:
            prompt_ids = encode(self.tokenizer, render_prompt(self.tokenizer, req.messages or [], req.tools))
        if prompt_ids is not None:
            body.update(prompt=prompt_ids, logprobs=1)
            choice = _first_choice(self._post("/completions", body), "/completions")
            lp = choice.get("logprobs") or {}
            tokens, logps = lp.get("tokens") or [], lp.get("token_logprobs") or []
            text = choice.get("text") or ""
        else:
            body.update(logprobs=True, top_logprobs=0, **self._chat_fields(req))
            choice = _first_choice(self._post("/chat/completions", body), "/chat/completions")
            content = (choice.get("logprobs") or {}).get("content") or []
            tokens, logps = [c["token"] for c in content], [c["logprob"] for c in content]
            text = self._action(choice)
        ids = [_token_id(t) for t in tokens]
        return Generation(text=text, token_ids=[t for t in ids if t is not None] if all(
            t is not None for t in ids) else [], logprobs=[float(x) for x in logps if x is not None],
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",  # "tool_calls" ends a turn
            prompt_tokens=len(prompt_ids) if prompt_ids is not None else 0, prompt_ids=prompt_ids or [],
            request_index=i, sample_index=j)

    def _chat_fields(self, req: Request) -> dict[str, Any]:
        """``messages`` (and ``tools``) of a chat request: in the OpenAI tool form when native (module docstring)."""
        messages = [dict(m) for m in req.messages or []]
        native = self.tool_calls == "native"
        if native and self.tool_format is not None:
            tools = [dict(t) for t in req.tools] if req.tools else self.tool_format.schemas()
            return {"messages": self.tool_format.wire_messages(messages), "tools": tools}
        fields: dict[str, Any] = {"messages": messages}
        if req.tools:
            fields["tools"] = [dict(t) for t in req.tools]
            if not native:
                fields["tool_choice"] = "none"  # the schemas inform the template; the model writes calls as text
        return fields

    def _action(self, choice: dict[str, Any]) -> str:
        """The env's action text of a chat answer: its tool calls in the env's format, else its content."""
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ServerError(f"expected choices[0].message in the response of /chat/completions, got keys "
                              f"{sorted(choice)}; fix: check that the server is OpenAI-compatible")
        if message.get("tool_calls"):
            if self.tool_format is None:
                raise ServerError("expected a text answer, got message.tool_calls, which this policy has no env tool "
                                  "format to map; fix: --tool-calls native (in Python: policy_from_spec(..., "
                                  "make_env=...) or OpenAIPolicy(tool_format=ToolFormat.of_env(env)))")
            return self.tool_format.action(message, "the response of /chat/completions")  # type: ignore[return-value]
        content = message.get("content")
        if not isinstance(content, str):
            raise ServerError(f"expected message.content text or message.tool_calls in the response of "
                              f"/chat/completions, got neither (message keys {sorted(message)}); fix: check the "
                              "server's tool-call parser (vllm serve --enable-auto-tool-choice --tool-call-parser "
                              "hermes) or use tool_calls='text'")
        return content

    def models(self) -> list[str]:
        """The model names the server lists at ``GET /models``."""
        data = self._request("/models", None)
        return [str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request(path, json.dumps(body).encode())

    def _request(self, path: str, data: bytes | None) -> dict[str, Any]:
        """POST ``data`` (GET when None) to ``path`` with retries; the parsed JSON object of the response."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url, last, wait = self.base_url + path, "", 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(max(wait, self.backoff * 2 ** (attempt - 1) * (0.5 + random.random())))
            wait = 0.0
            try:
                req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
                with self._slots, urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:500].decode(errors='replace')}"
                if exc.code not in RETRY_STATUS:
                    fix = "check the model name and the request settings"
                    if "context length" in last.lower():
                        fix = ("the conversation outgrew the server's context; serve with a longer context "
                               "(vllm serve --max-model-len), or lower --max-new-tokens or the env's max_turns")
                    elif b'"tools"' in (data or b"") and "tool" in last.lower():
                        fix = ("serve with a tool-call parser (vllm serve --enable-auto-tool-choice --tool-call-parser "
                               "hermes), or send calls as text (--tool-calls text)")
                    raise ServerError(f"expected an answer from {url}, got {last} (refused, not retried); "
                                      f"fix: {fix}") from None
                wait = min(_retry_after(exc.headers.get("Retry-After")), self.max_wait)
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
                continue
            try:
                out = json.loads(raw)
            except json.JSONDecodeError:
                out = None
            if not isinstance(out, dict):
                raise ServerError(f"expected a JSON object from {url}, got {raw[:200]!r}; fix: check that the base "
                                  "URL points at an OpenAI-compatible API (it usually ends in /v1)")
            return out
        raise ServerError(f"expected a response from {url}, got {last} (after {self.max_retries} retries); fix: "
                          "check that the server is up and serves this model")


def _first_choice(response: dict[str, Any], path: str) -> dict[str, Any]:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerError(f"expected 'choices' in the response of {path}, got keys {sorted(response)}; fix: check "
                          "that the server is OpenAI-compatible")
    return choices[0]


def _retry_after(value: str | None) -> float:
    """Seconds a ``Retry-After`` header asks for (its delta-seconds form; 0 when absent or a date)."""
    try:
        return max(float(value), 0.0) if value else 0.0
    except ValueError:
        return 0.0


def _token_id(token: str) -> int | None:
    """vLLM's `return_tokens_as_token_ids` renders each token as "token_id:<id>"."""
    if token.startswith("token_id:"):
        try:
            return int(token[len("token_id:"):])
        except ValueError:
            return None
    return None
