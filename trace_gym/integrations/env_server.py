"""The env server: one env of the operator's choosing served on OpenEnv's protocol, with branching as an
extension, so that a trainer in any process (any language, OpenEnv's clients unchanged) plays its episodes and
branches them from a snapshot as often as it likes.

    trace-gym serve --env trace/Arithmetic-v0 --env-args '{"n_tasks": 100}' --port 8765

The operator names the env (a registered id, ``module:id`` or ``module:Class``; checked to be a trace-gym
``TextEnv`` class before anything of it is called) and its arguments; a client chooses tasks and plays turns,
never code, specs or paths. Built on FastAPI and uvicorn
(from a checkout: ``pip install -e '.[serve]'``).

==============================  ========================================================================
route                           what it does (bodies: `trace_gym.integrations.serve_payloads`)
==============================  ========================================================================
``POST /reset``                 a new session's episode (``X-Session-Id`` of the answer names it); with
                                ``X-Session-Id``: a new episode in that session. ``{seed, episode_id,
                                task_id, index}`` -> ``{observation, reward, done}``
``POST /step``                  ``{action: {message}}`` in the session -> ``{observation, reward, done}``
``GET /state``                  the session's ``{episode_id, step_count, task_id, done, messages}``
``GET /schema``                 the action, observation and state JSON schemas
``GET /metadata``, ``/health``  the env's name and description; ``{status: healthy}``
``POST /mcp``                   JSON-RPC 2.0: ``tools/list`` gives the env's tools (calls go in turns)
``WS /ws``                      OpenEnv's WebSocket session: one session per connection, messages
                                ``reset``, ``step``, ``state``, ``close``, and ``snapshot``, ``restore``,
                                ``release``
``POST /snapshot``              extension: ``{snapshot}``, a handle to the session's episode now
``POST /restore``               extension: ``{snapshot}`` -> the session back there (the handle stays)
``POST /branch``                extension: ``{snapshot}`` -> a new session restored there (its
                                ``X-Session-Id``), played in parallel with the first
``POST /release``, ``/close``   extension: free a handle; close the session and its handles
==============================  ========================================================================

Safety (`serve_guard`): the ``Host`` must be the bound address, no ``Origin`` (browsers), JSON bodies only
with a ``Content-Length`` within the longest action the env takes (`body_bound`, 1 MiB for the bundled envs)
and at most ten thousand strings, containers and items (WebSocket messages alike), and a token on every request
when the server has tokens (required to bind anything but loopback). Connections (`serve_connections`): one
that has not shown a valid request within 2 s is closed, one address holds at most 8 such and 128 in all, and
room for 64 of the 256 is kept for connections that showed one; whole requests within a timeout. Sessions have
unguessable ids and belong to their credential or connection (`serve_sessions`); sessions and snapshot handles
share one budget derived from the host (`serve_budget`), refused past it (503). A client's mistake is a 4xx
with ``{"detail": "expected ..., got ...; fix: ..."}``; a model's malformed turn is the env's error observation.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from trace_gym.env import TextEnv
from trace_gym.env_specs import EnvFactory, resolve_env_spec, spec_class
from trace_gym.errors import ConfigError, SetupError, SnapshotError, UserError

try:
    import uvicorn
    from fastapi import FastAPI, Header, Request, Response, WebSocket, WebSocketDisconnect
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import ValidationError
except ImportError as exc:  # one line with the fix, not a traceback into the import
    raise SetupError(f"expected the env server's packages (fastapi, uvicorn, websockets), got no {exc.name}; "
                      "fix: pip install -e '.[serve]' (from the checkout)") from None

import trace_gym
from trace_gym.integrations.serve_budget import BudgetFull, LiveBudget, host_budget, unit_footprint
from trace_gym.integrations.serve_connections import ConnectionLimits, guarded_protocols
from trace_gym.integrations.serve_guard import RequestGuard, allowed_host_names, is_loopback, too_many_items
from trace_gym.integrations.serve_payloads import (
    EnvResult,
    EpisodeState,
    HandleRequest,
    HandleResponse,
    Health,
    Metadata,
    ResetRequest,
    Schemas,
    StepRequest,
    TurnAction,
    TurnObservation,
)
from trace_gym.integrations.serve_sessions import (
    Live,
    SessionTable,
    UnknownSession,
    check_playable,
    result_of_reset,
    result_of_step,
    state_of,
)
from trace_gym.integrations.session import EnvSession

__all__ = ["MAX_BODY", "EnvServer", "ServeLimits", "body_bound", "build_app", "served_env_class"]

MAX_BODY = 1 << 20
"""The least body (and WebSocket message) a server takes; an env whose actions may be longer raises it
(`body_bound`)."""
WS_QUEUE = 2
"""WebSocket messages read ahead of the one being answered (a client sends one and waits for its answer)."""
SESSION_HEADER = "X-Session-Id"
SessionId = Annotated[str | None, Header(alias=SESSION_HEADER, description="the session POST /reset opened")]


@dataclass(frozen=True)
class ServeLimits:
    """The server's bounds: live units (None: the host's budget), connections (`serve_connections`: in all, per
    peer, waiting ones, the room reserved for admitted ones, seconds to show a valid request and to send a whole
    one), seconds a session may sit unused, and the largest body or WebSocket message (None: `body_bound` of the
    served env)."""

    max_live: int | None = None
    max_connections: int = 256
    request_timeout_s: float = 10.0
    session_idle_s: float = 600.0
    max_body: int | None = None
    admit_timeout_s: float = 2.0
    max_per_peer: int | None = None
    max_waiting_per_peer: int = 8
    reserved_connections: int | None = None

    def connections(self) -> ConnectionLimits:
        """The connection bounds; unset, ``max_per_peer`` is half of ``max_connections`` and the reserved room a
        quarter."""
        per_peer = self.max_per_peer if self.max_per_peer is not None else max(1, self.max_connections // 2)
        reserved = self.reserved_connections if self.reserved_connections is not None else self.max_connections // 4
        return ConnectionLimits(self.max_connections, reserved, per_peer, min(self.max_waiting_per_peer, per_peer),
                                self.admit_timeout_s, self.request_timeout_s)


def served_env_class(spec: str) -> type[TextEnv]:
    """The env class ``spec`` names, checked to be a ``TextEnv`` subclass before anything of it is called (the
    spec's module is imported: the operator chose it)."""
    creator = spec_class(spec)
    if creator is None or not issubclass(creator, TextEnv):
        entry = resolve_env_spec(spec).entry_point
        what = getattr(creator, "__name__", None) or getattr(entry, "__name__", None) or type(entry).__name__
        raise ConfigError(f"expected {spec} to name a trace_gym env class (a TextEnv subclass), got {what}; fix: "
                          "serve a registered id (trace-gym envs lists them) or module:Class of your env")
    return creator


def body_bound(env: TextEnv) -> int:
    """The largest body the server reads for ``env``: its longest action (``max_action_chars``) as JSON may
    write it (12 bytes a character, a surrogate pair of escapes), with 64 KiB for the other fields; at least
    `MAX_BODY`."""
    return max(MAX_BODY, 12 * int(getattr(env, "max_action_chars", 0)) + (64 << 10))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:2000]


def _mcp_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The env's tool schemas (OpenAI's form) in MCP's ``tools/list`` form."""
    out = []
    for tool in tools:
        fn = tool.get("function", tool)
        out.append({"name": fn.get("name", ""), "description": fn.get("description", ""),
                    "inputSchema": fn.get("parameters", {"type": "object"})})
    return out


def _rpc(request_id: Any, result: Any = None, error: tuple[int, str] | None = None) -> dict[str, Any]:
    if error is not None:
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": error[0], "message": error[1]}}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def answer_rpc(message: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON-RPC 2.0 answer to ``message``: ``tools/list`` gives the env's tools; a tool is called inside a
    turn (an action of ``/step``), never on its own."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return _rpc(None, error=(-32600, "expected a JSON-RPC 2.0 request {jsonrpc: '2.0', method, id}"))
    method, request_id = message["method"], message.get("id")
    if method == "tools/list":
        return _rpc(request_id, {"tools": _mcp_tools(tools)})
    if method == "tools/call":
        return _rpc(request_id, error=(-32601, "expected tools/list, got tools/call; fix: a tool runs inside an "
                                               "episode's turn: send the call as the action of a step"))
    return _rpc(request_id, error=(-32601, f"expected the method tools/list, got {method[:100]!r}"))


def build_app(spec: str, env_args: Mapping[str, Any] | None, budget: LiveBudget, limits: ServeLimits) -> FastAPI:
    """The FastAPI app of the module docstring's routes, serving ``spec`` built with ``env_args`` (checked here:
    one env is built and closed)."""
    env_class = served_env_class(spec)
    factory = EnvFactory(spec, dict(env_args or {}))
    first = EnvSession(factory)  # the operator's arguments fail now, with their fix, not at a client's request
    tools = first.tools
    doc = inspect.getdoc(env_class) or env_class.__name__
    metadata = Metadata(name=spec, description=doc.split("\n\n")[0].replace("\n", " "),
                        version=trace_gym.__version__, author="trace-gym")
    table = SessionTable(factory, budget, limits.session_idle_s, spare=first)
    max_body = limits.max_body if limits.max_body is not None else body_bound(first.base)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(table.reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            await table.close_all()

    # OpenEnv's validator reads info.version as the OpenEnv HTTP API's version (its profile openenv-http/1.x);
    # trace-gym's own version is in /metadata. No /docs page: it would load scripts into a browser.
    app = FastAPI(title=f"trace-gym env server: {spec}", version="1.0.0", lifespan=lifespan, docs_url=None,
                  redoc_url=None, description=__doc__.split("\n\n")[0])
    app.state.table, app.state.max_body = table, max_body

    def owner(request: Request | WebSocket) -> str:
        return request.scope["state"]["owner"]

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError) -> JSONResponse:
        status = 404 if isinstance(exc, UnknownSession) else 503 if isinstance(exc, BudgetFull) else 400
        return JSONResponse({"detail": _one_line(exc)}, status_code=status)

    @app.exception_handler(SnapshotError)
    async def snapshot_error(request: Request, exc: SnapshotError) -> JSONResponse:
        return JSONResponse({"detail": _one_line(exc)}, status_code=400)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:  # the server lives on
        return JSONResponse({"detail": f"{type(exc).__name__}: {_one_line(exc)}"}, status_code=500)

    async def reset_live(live: Live, body: ResetRequest) -> EnvResult:
        out = await table.call(live, live.session.reset, body.task_id, body.index, body.seed)
        live.episode_id = body.episode_id
        return result_of_reset(out, live.session)

    async def step_live(live: Live, action: TurnAction) -> EnvResult:
        def play() -> dict[str, Any]:
            check_playable(live.session)
            return live.session.step(action.message)

        return result_of_step(await table.call(live, play), live.session)

    @app.post("/reset", response_model=EnvResult, tags=["OpenEnv"])
    async def reset(request: Request, response: Response, body: ResetRequest | None = None,
                    session_id: SessionId = None) -> EnvResult:
        """Start an episode: in a new session (named by the answer's X-Session-Id), or in the one named."""
        body = body or ResetRequest()
        fresh = session_id is None
        live = await table.open(owner(request)) if fresh else table.get(session_id, owner(request))
        try:
            result = await reset_live(live, body)
        except BaseException:
            if fresh:
                await table.close(live)
            raise
        response.headers[SESSION_HEADER] = live.id
        return result

    @app.post("/step", response_model=EnvResult, tags=["OpenEnv"])
    async def step(request: Request, body: StepRequest, session_id: SessionId = None) -> EnvResult:
        """Play one assistant turn in the session."""
        return await step_live(table.get(session_id, owner(request)), body.action)

    @app.get("/state", response_model=EpisodeState, tags=["OpenEnv"])
    async def state(request: Request, session_id: SessionId = None) -> EpisodeState:
        """The session's episode: its task, turn count, whether it ended, and the whole chat."""
        live = table.get(session_id, owner(request))
        return await table.call(live, state_of, live)

    @app.get("/schema", response_model=Schemas, tags=["OpenEnv"])
    async def schema() -> Schemas:
        return Schemas(action=TurnAction.model_json_schema(), observation=TurnObservation.model_json_schema(),
                       state=EpisodeState.model_json_schema())

    @app.get("/metadata", response_model=Metadata, tags=["OpenEnv"])
    async def get_metadata() -> Metadata:
        return metadata

    @app.get("/health", response_model=Health, tags=["OpenEnv"])
    async def health() -> Health:
        return Health()

    @app.post("/mcp", tags=["OpenEnv"])
    async def mcp(request: Request) -> dict[str, Any]:
        """JSON-RPC 2.0: ``tools/list``."""
        try:
            message = json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _rpc(None, error=(-32700, "expected a JSON-RPC request, got a body that is not JSON"))
        return answer_rpc(message, tools)

    @app.post("/snapshot", response_model=HandleResponse, tags=["branching"])
    async def snapshot(request: Request, session_id: SessionId = None) -> HandleResponse:
        """A handle to the session's episode now; it counts against the server's budget until released."""
        return HandleResponse(snapshot=await table.snapshot(table.get(session_id, owner(request))))

    @app.post("/restore", response_model=EnvResult, tags=["branching"])
    async def restore(request: Request, body: HandleRequest, session_id: SessionId = None) -> EnvResult:
        """The session back at the snapshot (which stays valid)."""
        live = table.get(session_id, owner(request))
        return result_of_reset(await table.call(live, live.session.restore, body.snapshot), live.session)

    @app.post("/branch", response_model=EnvResult, tags=["branching"])
    async def branch(request: Request, response: Response, body: HandleRequest,
                     session_id: SessionId = None) -> EnvResult:
        """A new session (the answer's X-Session-Id) restored to the session's snapshot."""
        new, out = await table.branch(table.get(session_id, owner(request)), body.snapshot)
        response.headers[SESSION_HEADER] = new.id
        return result_of_reset(out, new.session)

    @app.post("/release", tags=["branching"])
    async def release(request: Request, body: HandleRequest, session_id: SessionId = None
                      ) -> dict[str, Any]:
        await table.release(table.get(session_id, owner(request)), body.snapshot)
        return {}

    @app.post("/close", tags=["branching"])
    async def close(request: Request, session_id: SessionId = None) -> dict[str, Any]:
        await table.close(table.get(session_id, owner(request)))
        return {}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            live = await table.open(owner(websocket), listed=False)
        except UserError as exc:
            code = "CAPACITY_REACHED" if isinstance(exc, BudgetFull) else "SESSION_ERROR"
            await websocket.send_text(json.dumps({"type": "error", "data": {"message": _one_line(exc),
                                                                             "code": code}}))
            await websocket.close()
            return
        try:
            while True:
                try:
                    message = await asyncio.wait_for(websocket.receive(), limits.session_idle_s)
                except TimeoutError:
                    await websocket.send_text(json.dumps(_ws_error(
                        f"expected a message within {limits.session_idle_s:g} s, got none; the session is closed",
                        "SESSION_ERROR")))
                    break
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    reply: dict[str, Any] | None = _ws_error("expected a text frame of JSON, got a binary frame",
                                                             "INVALID_JSON")
                else:
                    reply = await ws_answer(live, text)
                if reply is None:
                    break
                await websocket.send_text(json.dumps(reply))
        finally:
            await table.close(live)
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client may have gone first
                await websocket.close()

    async def ws_answer(live: Live, text: str) -> dict[str, Any] | None:
        """The answer to one WebSocket message (None: the client closes the session)."""
        refusal = too_many_items(text)
        if refusal is not None:
            return _ws_error(refusal, "INVALID_JSON")
        try:
            message = json.loads(text)
        except json.JSONDecodeError as exc:
            return _ws_error(f"expected a JSON message, got {text[:80]!r} ({exc})", "INVALID_JSON")
        if not isinstance(message, dict):
            return _ws_error(f"expected a JSON object {{type, data}}, got {type(message).__name__}", "INVALID_JSON")
        kind, data = message.get("type"), message.get("data") or {}
        try:
            if kind == "close":
                return None
            if kind == "reset":
                return {"type": "observation", "data": (await reset_live(live, ResetRequest.model_validate(data))
                                                        ).model_dump()}
            if kind == "step":
                return {"type": "observation", "data": (await step_live(live, TurnAction.model_validate(data))
                                                        ).model_dump()}
            if kind == "state":
                return {"type": "state", "data": (await table.call(live, state_of, live)).model_dump()}
            if kind == "snapshot":
                return {"type": "snapshot", "data": {"snapshot": await table.snapshot(live)}}
            if kind == "restore":
                handle = HandleRequest.model_validate(data).snapshot
                out = await table.call(live, live.session.restore, handle)
                return {"type": "observation", "data": result_of_reset(out, live.session).model_dump()}
            if kind == "release":
                await table.release(live, HandleRequest.model_validate(data).snapshot)
                return {"type": "released", "data": {}}
            if kind == "mcp":
                return {"type": "mcp", "data": answer_rpc(data, tools)}
            return _ws_error(f"expected a message type of reset, step, state, close, snapshot, restore, release or "
                             f"mcp, got {str(kind)[:80]!r}", "UNKNOWN_TYPE")
        except ValidationError as exc:
            return {"type": "error", "data": {"message": "Invalid message", "code": "VALIDATION_ERROR",
                                              "errors": json.loads(exc.json(include_url=False))}}
        except BudgetFull as exc:
            return _ws_error(_one_line(exc), "CAPACITY_REACHED")
        except (UserError, SnapshotError) as exc:
            return _ws_error(_one_line(exc), "VALIDATION_ERROR")
        except Exception as exc:  # a bug in the env or here: its one line, and the session lives on
            return _ws_error(f"{type(exc).__name__}: {_one_line(exc)}", "EXECUTION_ERROR")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{**e, "input": _short(e["input"])} if "input" in e else e for e in exc.errors()]
        return JSONResponse({"detail": json.loads(json.dumps(errors, default=str))}, status_code=422)

    return app


def _short(value: Any) -> Any:
    """A refused field's value as the answer shows it: itself when short, else the start of its text."""
    text = json.dumps(value, default=str)
    return value if len(text) <= 200 else text[:200] + "..."


def _ws_error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


class EnvServer:
    """``with EnvServer("trace/Arithmetic-v0", {"n_tasks": 10}) as server: server.url`` serves on a thread;
    ``serve_forever()`` in the foreground. ``tokens``: the credentials clients present (each client its own:
    sessions belong to the token that opened them), required unless ``host`` is loopback. ``allow_hosts``:
    more ``Host`` names to answer (the bound address always is)."""

    def __init__(self, env: str, env_args: Mapping[str, Any] | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, tokens: Iterable[str] = (), allow_hosts: Iterable[str] = (),
                 limits: ServeLimits = ServeLimits()):
        tokens = tuple(t for t in tokens if t)
        connection_limits = limits.connections()  # a bound that cannot work fails before anything starts
        if not is_loopback(host) and not tokens:
            raise ConfigError(f"expected a token to bind {host} (anything but loopback), got none; fix: write one "
                              "to a file only you can read (python -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))' > token; chmod 600 token) and pass "
                              "--token-file token, or bind 127.0.0.1")
        if any(len(t) < 16 for t in tokens):
            raise ConfigError("expected tokens of at least 16 characters, got a shorter one; fix: use "
                              "secrets.token_urlsafe(32)")
        footprint = unit_footprint(served_env_class(env))
        most = host_budget(footprint, limits.max_connections)
        if limits.max_live is not None and limits.max_live > most:
            raise ConfigError(f"expected max_live at most {most} (this host's budget for {env}: "
                              f"{footprint.processes:g} processes and {int(footprint.memory_bytes) >> 20} MiB each), "
                              f"got {limits.max_live}; fix: leave it unset or lower")
        self.budget = LiveBudget(limits.max_live if limits.max_live is not None else most)
        self.limits = limits
        self.app = build_app(env, env_args, self.budget, limits)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as exc:
            self.socket.close()
            raise ConfigError(f"expected to bind {host}:{port}, got {exc.strerror}; fix: choose another --port") \
                from None
        bound = self.socket.getsockname()[1]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}"
        self.max_body = self.app.state.max_body
        guard = RequestGuard(self.app, allowed_host_names(host, allow_hosts), tokens, self.max_body)
        # No per-message compression: a few KiB on the wire would inflate to max_body each.
        http, ws, self.connections = guarded_protocols(connection_limits, guard.admits)
        config = uvicorn.Config(guard, http=http, ws=ws or "auto", ws_max_size=self.max_body, ws_max_queue=WS_QUEUE,
                                ws_per_message_deflate=False, timeout_keep_alive=5, lifespan="on",
                                log_level="warning", access_log=False, server_header=False)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def sessions(self) -> int:
        """Sessions open now (HTTP and WebSocket)."""
        return len(self.app.state.table)

    def serve_forever(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def close(self) -> None:
        """Stop serving; every session's env is closed on the way out."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=120)
        self.socket.close()

    def __enter__(self) -> EnvServer:
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True,
                                        name="trace-gym-env-server")
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise ConfigError(f"expected the env server to start at {self.url}, got it stopped; see its log")
            self._thread.join(timeout=0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

