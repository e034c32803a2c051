"""OpenAI-compatible HTTP backend (a `vllm serve` or SGLang server the user runs, or a hosted API), over the
`openai` SDK's client (its connection pool, timeouts and retries).

Token-id prompts (and message prompts when a local tokenizer is given) go to `/v1/completions` with the ids
as the prompt: the model writes its tool calls as text and the env parses them. Message prompts otherwise go to
`/v1/chat/completions`. There, with ``tool_calls="native"`` and the env's `ToolFormat` (`policy_from_spec`
reads it from the env), the request carries the env's tool schemas as ``tools``, the env's native system
message, the history in the OpenAI form (assistant ``tool_calls``, results with their ``tool_call_id``); an
answer's ``message.tool_calls`` become the env's action text and a message without tool calls is the final
answer (agents/native_tools.py). With ``tool_calls="text"`` the messages go as the env wrote them and the
answer's ``content`` is the action. An answer with neither content nor tool calls, or tool calls the policy has
no format for, raises `ServerError`: it is never read as an empty turn.

Hosted reasoning models (OpenAI's o-series, gpt-5) refuse some standard fields with HTTP 400 (``"code":
"unsupported_parameter"`` or ``"unsupported_value"``, the field in ``"param"``). The policy adapts once, for
every later request, and logs a warning per field: ``max_tokens`` becomes ``max_completion_tokens``; ``logprobs``
(with ``top_logprobs``), ``temperature``, ``top_p`` and ``seed`` are left out (the server's default then
applies). Without log-probabilities a generation has none (`Generation.logprobs` empty): evaluation is unchanged,
but its turns cannot be trained on. ``extra_body`` adds fields to every request (``{"reasoning_effort": "low"}``);
they are sent as given and never adapted.

Requests carry the standard fields only, unless the server is vLLM (``server="vllm"``, or ``"auto"`` and the
server's ``GET /models`` says ``owned_by: vllm``): then they ask for ``return_tokens_as_token_ids`` (exact
token ids) and pass vLLM's extra sampling fields (top_k, min_tokens, include_stop_str_in_output). Each (request,
sample) pair is one HTTP call with its own seed; at most `concurrency` calls are in flight at once, over all
threads that share the policy (a trainer's env workers, several evaluations).

Failures: transient ones (connection errors and timeouts once the server has answered, 408/409/429/5xx) are
retried by the SDK with exponential backoff, honouring ``Retry-After``; each retry is logged as a warning
(logger ``trace_gym.agents.openai_backend``, on stderr by default) with its count, so that a slow server is
seen waiting. A server never reached (connection refused, unknown host, connect timeout) is not retried: the
error says so at once. A request that still fails after its retries, or that the server refuses because its
conversation outgrew the context, is that row's error: the generation comes back with `Generation.error` (the
server's message and the fix), and a caller that plays many episodes (`trace-gym eval`) ends that episode with
the error on record and goes on. Other refusals (4xx: a key, a model name, a field the server does not take
beyond the adaptable ones above) would meet every request alike: they raise `ServerError`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import openai

from trace_gym.agents.chat import encode, render_prompt
from trace_gym.agents.native_tools import ToolFormat
from trace_gym.agents.policy import Generation, Request, SamplingParams, row_seed
from trace_gym.errors import ConfigError, ServerError

__all__ = ["ADAPTABLE", "RETRY_STATUS", "OpenAIPolicy", "ServerError"]

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
"""Statuses worth a retry (the SDK retries these and every other 5xx)."""

CONNECT_TIMEOUT = 5.0
"""Seconds to open a connection: a host that does not answer within it is unreachable, not slow."""

ADAPTABLE: dict[str, str | None] = {"max_tokens": "max_completion_tokens", "logprobs": None, "top_logprobs": None,
                                    "temperature": None, "top_p": None, "seed": None}
"""Request fields a server may refuse as unsupported, and what replaces each (None: the field is left out)."""
RESERVED = frozenset({"model", "messages", "prompt", "n", "stream"})
"""Request fields that ``extra_body`` may not set: the policy's request and its one answer per call."""

log = logging.getLogger(__name__)
Server = Literal["auto", "vllm", "openai"]


class OpenAIPolicy:
    """`Policy` over an OpenAI-compatible server at `base_url` (e.g. "http://127.0.0.1:8000/v1")."""

    def __init__(self, base_url: str, model: str, tokenizer=None, api_key: str | None = None,
                 server: Server = "auto", timeout: float = 120.0, max_retries: int = 5, concurrency: int = 16,
                 tool_calls: Literal["native", "text"] = "native", tool_format: ToolFormat | None = None,
                 extra_body: dict[str, Any] | None = None):
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ConfigError(f"expected concurrency >= 1, max_retries >= 0, timeout > 0, got {concurrency}, "
                              f"{max_retries}, {timeout}")
        if tool_calls not in ("native", "text"):
            raise ConfigError(f"expected tool_calls 'native' or 'text', got {tool_calls!r}")
        if server not in ("auto", "vllm", "openai"):
            raise ConfigError(f"expected server 'auto', 'vllm' or 'openai', got {server!r}")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ConfigError(f"expected extra_body to be a JSON object, got {type(extra_body).__name__}; fix: e.g. "
                              "--extra-body '{\"reasoning_effort\": \"low\"}'")
        reserved = sorted(RESERVED & set(extra_body or {}))
        if reserved:
            raise ConfigError(f"expected extra_body fields beside the request, got {reserved}, which the policy "
                              "sets itself; fix: drop them (the model is --model, the messages are the env's)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.api_key = api_key
        self.server = server
        """"auto" until the first request asks the server what it is, then "vllm" or "openai"."""
        self.timeout = timeout
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.tool_calls = tool_calls
        self.tool_format = tool_format
        """The env's tools and action parser, for native tool calls (`ToolFormat.of_env(env)`)."""
        self.extra_body = dict(extra_body or {})
        """Fields added to every request, as given (module docstring)."""
        self.adapted: dict[str, str | None] = {}
        """The fields the server refused, each with its replacement (None: left out); filled as refusals come."""
        self._adapt = threading.Lock()
        self.reached = False
        """Whether the server has answered once; before that a connection error is not retried."""
        self._slots = threading.BoundedSemaphore(concurrency)  # the in-flight limit, shared by every caller
        self._detect = threading.Lock()
        http = httpx.Client(transport=_ReportingTransport(self),
                            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
                            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)))
        # No key: the SDK wants one, and "EMPTY" is what vLLM's docs pass to a server started without --api-key.
        self._client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "EMPTY", max_retries=max_retries,
                                     timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
                                     http_client=http)

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Generation]:
        """Sample ``sampling.n`` continuations of every request (the ``Policy`` contract), one HTTP call each."""
        self._resolve_server()
        keys = [(i, j) for i in range(len(requests)) for j in range(sampling.n)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(len(keys), 1))) as pool:
            return list(pool.map(lambda key: self._row(requests[key[0]], sampling, *key), keys))

    def _row(self, req: Request, sampling: SamplingParams, i: int, j: int) -> Generation:
        """One row; a request that failed after its retries, or that the server refused for its content, is the
        row's `Generation.error` (the `Policy` contract); a setup failure raises."""
        try:
            return self._one(req, sampling, i, j)
        except _RowError as exc:
            return Generation(text="", token_ids=[], logprobs=[], finish_reason="error", prompt_tokens=0,
                              request_index=i, sample_index=j, error=str(exc))

    def _resolve_server(self) -> None:
        """Settle ``server="auto"``: vLLM when its model list says so, else the standard fields only."""
        if self.server != "auto":
            return
        with self._detect:
            if self.server != "auto":
                return
            try:
                self.models()
            except ServerError as exc:
                if not self.reached:
                    raise
                log.warning("%s: GET /models failed (%s); sending the standard OpenAI fields only", self.base_url,
                            exc)
                self.server = "openai"

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
            choice = _first_choice(self._send("/completions", body), "/completions")
            lp = choice.get("logprobs") or {}
            tokens, logps = lp.get("tokens") or [], lp.get("token_logprobs") or []
            text = choice.get("text") or ""
        else:
            body.update(logprobs=True, top_logprobs=0, **self._chat_fields(req))
            choice = _first_choice(self._send("/chat/completions", body), "/chat/completions")
            content = (choice.get("logprobs") or {}).get("content") or []
            tokens, logps = [c["token"] for c in content], [c["logprob"] for c in content]
            text = self._action(choice)
        ids = [_token_id(t) for t in tokens]
        return Generation(text=text, token_ids=[t for t in ids if t is not None] if all(
            t is not None for t in ids) else [], logprobs=[float(x) for x in logps if x is not None],
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",  # "tool_calls" ends a turn
            prompt_tokens=len(prompt_ids) if prompt_ids is not None else 0, prompt_ids=prompt_ids or [],
            request_index=i, sample_index=j)

    def _send(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as adapted so far plus ``extra_body``; a field refused as unsupported is adapted (once, for
        every later request: module docstring) and the request sent again."""
        for _ in range(len(ADAPTABLE) + 1):
            sent = self._adapted(body)
            try:
                return self._request(path, sent)
            except _Unsupported as refused:
                self._learn(refused, sent)
        raise ServerError(f"expected an answer from {self.base_url + path} once the refused fields were adapted "
                          f"({sorted(self.adapted)}), got more refusals; fix: check the model name and the request "
                          "settings")

    def _adapted(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the refused fields renamed or left out, then ``extra_body`` over it."""
        out: dict[str, Any] = {}
        for key, value in body.items():
            if key not in self.adapted:
                out[key] = value
            elif self.adapted[key] is not None:
                out[self.adapted[key]] = value  # type: ignore[index]
        if "max_completion_tokens" in self.extra_body:
            out.pop("max_tokens", None)  # one limit: the caller's
        return {**out, **self.extra_body}

    def _learn(self, refused: _Unsupported, sent: dict[str, Any]) -> None:
        """Record the adaptation of a field the server refused (module docstring); the warning is logged once."""
        field = refused.field
        if field in self.extra_body:
            raise ServerError(f"{refused.message}; fix: drop {field} from extra_body (--extra-body)") from None
        if field not in ADAPTABLE or field not in sent:
            raise ServerError(f"{refused.message}; fix: check the model name and the request settings") from None
        with self._adapt:
            if field in self.adapted:
                return  # another thread learnt it first
            self.adapted[field] = ADAPTABLE[field]
            if field == "logprobs":
                self.adapted["top_logprobs"] = None  # only valid beside logprobs
            what = {"max_tokens": "max_completion_tokens is sent in its place",
                    "logprobs": "requests go without log-probabilities (generations carry none: fine for "
                                "evaluation, not for training)"}.get(field, "it is left out and the server's "
                                                                            "default applies")
        log.warning("%s refuses %s (%s); from now on %s", self.base_url, field, refused.reason, what)

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
        """The env's action text of a chat answer: through the env's `ToolFormat` when native (its tool calls, else
        its content as the final answer), else its content."""
        message = choice.get("message")
        where = "the response of /chat/completions"
        if not isinstance(message, dict):
            raise ServerError(f"expected choices[0].message in {where}, got keys {sorted(choice)}; fix: check that "
                              "the server is OpenAI-compatible")
        if self.tool_calls == "native" and self.tool_format is not None:
            return self.tool_format.action(message, where)
        if message.get("tool_calls"):
            raise ServerError("expected a text answer, got message.tool_calls, which this policy has no env tool "
                              "format to map; fix: --tool-calls native (in Python: policy_from_spec(..., "
                              "make_env=...) or OpenAIPolicy(tool_format=ToolFormat.of_env(env)))")
        content = message.get("content")
        if not isinstance(content, str):
            raise ServerError(f"expected message.content text in {where}, got none (message keys "
                              f"{sorted(message)}); fix: check that the server is OpenAI-compatible")
        return content

    def close(self) -> None:
        """Close the client's connections (the policy is unusable afterwards)."""
        self._client.close()

    def models(self) -> list[str]:
        """The model names the server lists at ``GET /models`` (which also settles ``server="auto"``)."""
        listed = [m for m in self._request("/models", None).get("data") or [] if isinstance(m, dict)]
        if self.server == "auto":
            self.server = "vllm" if any(m.get("owned_by") == "vllm" for m in listed) else "openai"
        return [str(m["id"]) for m in listed if "id" in m]

    def _request(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """POST ``body`` (GET when None) to ``path``, the SDK retrying what is transient; the JSON object of the
        answer, else `ServerError` with the server's message and the fix."""
        url = self.base_url + path
        try:
            with self._slots:
                if body is None:
                    response = self._client.get(path, cast_to=httpx.Response)
                else:
                    response = self._client.post(path, body=body, cast_to=httpx.Response)
                raw = response.read()
        except _Unreachable as exc:
            raise ServerError(f"expected a server at {self.base_url}, got {exc.reason} (not retried: it never "
                              "answered); fix: start the server, wait until GET /models answers, or correct the "
                              "base URL (it usually ends in /v1)") from None
        except openai.APIStatusError as exc:
            detail = f"HTTP {exc.status_code}: {exc.response.text[:500]}"
            refused = _unsupported_field(exc.status_code, exc.response.text)
            if refused is not None and body is not None:
                raise _Unsupported(*refused, f"expected an answer from {url}, got {detail} (refused, not retried)"
                                   ) from None
            if exc.status_code in RETRY_STATUS or exc.status_code >= 500:
                raise _RowError(f"expected an answer from {url}, got {detail} (after {self.max_retries} retries); "
                                "fix: check that the server is up and serves this model") from None
            error = _RowError if _too_long(detail) else ServerError
            raise error(f"expected an answer from {url}, got {detail} (refused, not retried); fix: "
                        f"{_refusal_fix(detail, body)}") from None
        except openai.APIConnectionError as exc:  # APITimeoutError included
            cause = exc.__cause__ or exc
            raise _RowError(f"expected a response from {url}, got {type(cause).__name__}: {cause} (after "
                            f"{self.max_retries} retries); fix: check that the server is up and serves this "
                            "model") from None
        try:
            out = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            out = None
        if not isinstance(out, dict):
            raise ServerError(f"expected a JSON object from {url}, got {raw[:200]!r}; fix: check that the base "
                              "URL points at an OpenAI-compatible API (it usually ends in /v1)")
        return out


class _RowError(ServerError):
    """A failure of one request (its retries spent, or refused for what it asked): that row's error, not the
    caller's; `OpenAIPolicy.models` and direct calls still see it raised."""


class _Unsupported(Exception):
    """The server refused a request field as unsupported (HTTP 400): ``field``, ``reason`` (its error code)."""

    def __init__(self, field: str, reason: str, message: str):
        super().__init__(message)
        self.field, self.reason, self.message = field, reason, message


class _Unreachable(openai.APIConnectionError):
    """A server that has never answered refused or dropped the connection: the SDK does not retry its own
    errors, so this ends the request at once."""

    def __init__(self, reason: str, request: httpx.Request):
        super().__init__(message=reason, request=request)
        self.reason = reason


class _ReportingTransport(httpx.HTTPTransport):
    """httpx's transport, telling the policy's log of each failed attempt the SDK will retry, and ending at once
    the requests to a server that never answered."""

    def __init__(self, policy: OpenAIPolicy):
        super().__init__()
        self.policy = policy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        taken = int(request.headers.get("x-stainless-retry-count", "0") or 0)
        try:
            response = super().handle_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            if not self.policy.reached:
                raise _Unreachable(f"{type(exc).__name__}: {exc or 'no connection'}", request) from exc
            self._report(request, f"{type(exc).__name__}: {exc}", taken)
            raise
        except httpx.TransportError as exc:
            self._report(request, f"{type(exc).__name__}: {exc or 'no answer'}", taken)
            raise
        self.policy.reached = True
        if response.status_code in RETRY_STATUS or response.status_code >= 500:
            self._report(request, f"HTTP {response.status_code}", taken)
        return response

    def _report(self, request: httpx.Request, what: str, taken: int) -> None:
        if taken < self.policy.max_retries:
            log.warning("%s %s: %s; retry %d of %d", request.method, request.url, what, taken + 1,
                        self.policy.max_retries)


def _first_choice(response: dict[str, Any], path: str) -> dict[str, Any]:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerError(f"expected 'choices' in the response of {path}, got keys {sorted(response)}; fix: check "
                          "that the server is OpenAI-compatible")
    return choices[0]


def _unsupported_field(status: int, text: str) -> tuple[str, str] | None:
    """(field, code) of a 400 that refuses one request field as unsupported, in the OpenAI API's error form
    (``{"error": {"param": "max_tokens", "code": "unsupported_parameter", ...}}``), else None."""
    if status != 400:
        return None
    try:
        error = json.loads(text).get("error")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(error, dict) or not isinstance(error.get("param"), str):
        return None
    code = error.get("code")
    if code not in ("unsupported_parameter", "unsupported_value"):
        return None
    return error["param"], code


def _too_long(detail: str) -> bool:
    """Whether a refusal says the conversation outgrew the model's context (vLLM's and OpenAI's wording)."""
    return any(w in detail.lower() for w in ("context length", "maximum context", "context_length_exceeded"))


def _refusal_fix(detail: str, body: dict[str, Any] | None) -> str:
    """The fix for a request the server refused (4xx): a context overflow, tools without a parser, else a name."""
    if _too_long(detail):
        return ("the conversation outgrew the server's context; serve with a longer context (vllm serve "
                "--max-model-len), or lower --max-new-tokens or the env's max_turns")
    if body is not None and "tools" in body and "tool" in detail.lower():
        return ("serve with a tool-call parser (vllm serve --enable-auto-tool-choice --tool-call-parser hermes), or "
                "send calls as text (--tool-calls text)")
    return "check the model name and the request settings"


def _token_id(token: str) -> int | None:
    """vLLM's `return_tokens_as_token_ids` renders each token as "token_id:<id>"."""
    if token.startswith("token_id:"):
        try:
            return int(token[len("token_id:"):])
        except ValueError:
            return None
    return None
