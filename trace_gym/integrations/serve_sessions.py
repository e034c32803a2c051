"""The env server's sessions: each one env of the operator's, named by an unguessable id and owned by the
credential (HTTP) or the connection (WebSocket) that opened it. A request names a session by its id and is
answered only when its owner matches: any other id is unknown (404), whether or not it exists.

Every session and every snapshot handle takes a unit of the server's `LiveBudget`; closing a session gives
back its own and its handles'. Requests to one session run one at a time (its lock), each env call on a worker
thread, so sessions play in parallel: at most ``ENV_CALLS`` at once, handed out in turn by client
(`trace_gym.fairness`: the owner with the fewest calls running first, then its session with the fewest), and each
call runs on behalf of its owner and session, so that the shared resources it queues for (the answer checkers)
serve clients in turn too. A session unused for ``idle_s`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from anyio import to_thread

from trace_gym.env_specs import EnvFactory
from trace_gym.errors import ConfigError, UserError
from trace_gym.fairness import Client, FairQueue, on_behalf_of
from trace_gym.integrations.serve_budget import LiveBudget
from trace_gym.integrations.serve_payloads import EnvResult, EpisodeState, TurnObservation
from trace_gym.integrations.session import EnvSession

__all__ = ["Live", "SessionTable", "UnknownSession", "check_playable", "result_of_reset", "result_of_step", "state_of"]

T = TypeVar("T")
ENV_CALLS = 32
"""Env calls running at once on worker threads (below the 40 threads of anyio's default limiter, which the
sessions' opening and closing use too)."""


class UnknownSession(UserError):
    """No open session of this owner has the id (404)."""


@dataclass(eq=False)
class Live:
    """An open session: its id, owner, env session, the lock its requests take, and when it was last used."""

    id: str
    owner: str
    session: EnvSession
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    used: float = field(default_factory=time.monotonic)
    episode_id: str | None = None
    closed: bool = False


class FairSlots:
    """At most ``capacity`` holders at once, the waiting ones let in by `FairQueue`'s turn; event loop only."""

    def __init__(self, capacity: int):
        self.capacity, self.used = capacity, 0
        self.waiting: FairQueue[asyncio.Future[None]] = FairQueue()

    @contextlib.asynccontextmanager
    async def hold(self, client: Client) -> AsyncIterator[None]:
        turn = asyncio.get_running_loop().create_future()
        self.waiting.push(client, turn)
        self._hand_out()
        try:
            await turn
        except BaseException:  # cancelled (the client left): give back a slot handed over meanwhile
            if not self.waiting.remove(client, turn):
                self._give_back(client)
            raise
        try:
            yield
        finally:
            self._give_back(client)

    def _give_back(self, client: Client) -> None:
        self.waiting.done(client)
        self.used -= 1
        self._hand_out()

    def _hand_out(self) -> None:
        while self.used < self.capacity and len(self.waiting):
            _, turn = self.waiting.pop()
            self.used += 1
            if not turn.done():
                turn.set_result(None)


class SessionTable:
    """The open sessions of one server, all of ``factory``'s env, within ``budget``; ``spare``: an env built
    already (the server's check of the operator's arguments), the first session's."""

    def __init__(self, factory: EnvFactory, budget: LiveBudget, idle_s: float, spare: EnvSession | None = None):
        self.factory, self.budget, self.idle_s, self.spare = factory, budget, idle_s, spare
        self._live: dict[str, Live] = {}
        self._unlisted: set[Live] = set()
        self.slots = FairSlots(ENV_CALLS)

    def __len__(self) -> int:
        return len(self._live) + len(self._unlisted)

    async def open(self, owner: str, listed: bool = True) -> Live:
        """A new session of ``owner``; ``listed=False`` for a WebSocket's, which no id reaches."""
        self.budget.take("session")
        session, self.spare = self.spare, None
        try:
            if session is None:
                session = await to_thread.run_sync(EnvSession, self.factory)
        except BaseException:
            self.budget.give()
            raise
        live = Live(secrets.token_urlsafe(24), owner, session)
        if listed:
            self._live[live.id] = live
        else:
            self._unlisted.add(live)
        return live

    def get(self, session_id: str | None, owner: str) -> Live:
        """``owner``'s open session ``session_id``; `UnknownSession` otherwise (another owner's included)."""
        if not session_id:
            raise ConfigError("expected an X-Session-Id header naming your session, got none; fix: POST /reset "
                              "opens one (its answer's X-Session-Id header), or use the WebSocket /ws, which keeps "
                              "one session per connection")
        live = self._live.get(session_id)
        if live is None or live.closed or not secrets.compare_digest(live.owner, owner):
            raise UnknownSession(f"expected an open session of yours, got {session_id[:64]!r}; fix: POST /reset "
                                 "to open one (sessions close after "
                                 f"{self.idle_s:g} s unused)")
        return live

    async def call(self, live: Live, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, alone in ``live``, in its client's turn and on its behalf."""
        client = Client(live.owner, live.id)

        def run() -> T:
            with on_behalf_of(client):
                return fn(*args)

        async with live.lock:
            if live.closed:
                raise UnknownSession("expected an open session, got one closed meanwhile; fix: POST /reset")
            live.used = time.monotonic()
            try:
                async with self.slots.hold(client):
                    return await to_thread.run_sync(run)
            finally:
                live.used = time.monotonic()

    async def snapshot(self, live: Live) -> str:
        self.budget.take("snapshot handle")
        try:
            return await self.call(live, live.session.snapshot)
        except BaseException:
            self.budget.give()
            raise

    async def release(self, live: Live, handle: str) -> None:
        await self.call(live, live.session.release, handle)
        self.budget.give()

    async def branch(self, source: Live, handle: str) -> tuple[Live, dict[str, Any]]:
        """A new session of ``source``'s owner restored to ``source``'s snapshot ``handle``."""
        branch = await self.open(source.owner)
        try:
            async with source.lock:  # the snapshot is read while its own session waits
                out = await self.call(branch, branch.session.restore, handle, source.session)
        except BaseException:
            await self.close(branch)
            raise
        return branch, out

    async def close(self, live: Live) -> None:
        """Close ``live``'s env (its snapshots released) and give back its units."""
        self._live.pop(live.id, None)
        self._unlisted.discard(live)
        async with live.lock:
            if live.closed:
                return
            live.closed = True
            held = live.session.held
            try:
                await to_thread.run_sync(live.session.close)
            finally:
                self.budget.give(1 + held)

    async def close_idle(self) -> None:
        """Close every listed session unused for ``idle_s`` (a WebSocket times out its own)."""
        now = time.monotonic()
        for live in list(self._live.values()):
            if not live.lock.locked() and now - live.used > self.idle_s:
                await self.close(live)

    async def reap_forever(self) -> None:
        while True:
            await asyncio.sleep(max(0.5, min(30.0, self.idle_s / 4)))
            await self.close_idle()

    async def close_all(self) -> None:
        for live in [*self._live.values(), *self._unlisted]:
            await self.close(live)
        if self.spare is not None:
            await to_thread.run_sync(self.spare.close)
            self.spare = None


def _observation(out: dict[str, Any], messages: list[dict[str, Any]], **extra: Any) -> TurnObservation:
    return TurnObservation(text=out["observation"], messages=messages, task_id=out.get("task_id"), **extra)


def result_of_reset(out: dict[str, Any], session: EnvSession) -> EnvResult:
    """An `EnvSession.reset` or ``restore`` answer as OpenEnv's ``{observation, reward, done}``."""
    done = bool(out.get("done", False))
    return EnvResult(observation=_observation(out, out["messages"], turn=session.base.turn_count,
                                              tools=session.tools, terminated=done),
                     reward=None, done=done)


def result_of_step(out: dict[str, Any], session: EnvSession) -> EnvResult:
    """An `EnvSession.step` answer as OpenEnv's ``{observation, reward, done}`` (the reward is 0 until the turn
    that ends the episode)."""
    info = dict(out["info"])
    task_id, turn = info.pop("task_id", None), info.pop("turn", session.base.turn_count)
    obs = TurnObservation(text=out["observation"], messages=out["new_messages"], task_id=task_id, turn=turn,
                          terminated=out["terminated"], truncated=out["truncated"], info=info)
    return EnvResult(observation=obs, reward=out["reward"], done=out["done"])


def check_playable(session: EnvSession) -> None:
    """Refuse a step the episode cannot take (before reset, after its end) as the client's mistake."""
    if session.base.task is None:
        raise ConfigError("expected a started episode, got none; fix: POST /reset (WebSocket: a reset message) "
                          "before the first step")
    if session.base.done:
        raise ConfigError("expected a live episode, got one that has ended; fix: reset, or restore a snapshot")


def state_of(live: Live) -> EpisodeState:
    base = live.session.base
    return EpisodeState(episode_id=live.episode_id, step_count=base.turn_count,
                        task_id=base.task.id if base.task is not None else None, done=base.done,
                        messages=live.session.messages())
