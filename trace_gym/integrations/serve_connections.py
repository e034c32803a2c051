"""How many connections the env server holds, whose, and for how long: uvicorn's HTTP/1.1 protocol with the bounds
below, so that a client without a valid request cannot hold the room others need.

A connection is *waiting* from its first byte until it shows a valid request (the ``Host`` of the bound address,
no ``Origin``, the token when the server has tokens: the checks of `serve_guard.RequestGuard`, read from the
request's headers as soon as they are in), then *admitted* for the rest of its life (kept-alive requests, or the
WebSocket it upgrades to). The bounds (`ConnectionLimits`):

- a waiting connection is closed ``admit_timeout_s`` after it opened (408): sending nothing, a slow trickle of
  headers or a request that fails the checks holds a socket for that long at most;
- one peer (an IPv4 address; an IPv6 address's /64, which one host is usually given whole) keeps at most
  ``max_waiting_per_peer`` waiting connections: its next one closes its oldest waiting one (503), passing over
  one whose whole request head already waits unread in its socket. The newest stays because it may be a client
  behind the same address (another process on this machine, a NAT) whose request is on its way, while the
  oldest has had its time;
- one peer holds at most ``max_per_peer`` connections of either kind: past it, its oldest waiting connection is
  closed, or the new one is refused (503) when all of its connections are admitted;
- all peers together hold at most ``max_connections`` connections, of which at most ``max_connections -
  reserved`` waiting: room for ``reserved`` admitted connections is kept. A new connection past either bound
  closes the oldest waiting connection of any peer, or is refused (503) when every connection is admitted;
- an admitted connection sends each further request whole within ``request_timeout_s`` of its first byte (408),
  and idles at most uvicorn's keep-alive timeout between requests.

So a client without a token holds at most ``max_waiting_per_peer`` sockets per address, each for at most
``admit_timeout_s``, and can never take the ``reserved`` room or close an admitted connection. What it can still
do is open connections as fast as the machine accepts them (each costs the server an accept and a close): a
flood of new connections is the network's to limit (a firewall's rate limit), not the server's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from trace_gym.errors import ConfigError

__all__ = ["ConnectionLimits", "ConnectionTable", "guarded_protocols", "peer_of"]

Headers = Sequence[tuple[bytes, bytes]]
_PEEK = 16 << 10  # bytes of a waiting connection's unread data looked at for a whole request head


@dataclass(frozen=True)
class ConnectionLimits:
    """The server's bounds on connections (module docstring)."""

    max_connections: int = 256
    """Connections open at once, waiting or admitted."""
    reserved: int = 64
    """Of ``max_connections``, the room only admitted connections may take."""
    max_per_peer: int = 128
    """Connections one peer (an IPv4 address, an IPv6 /64) holds at once."""
    max_waiting_per_peer: int = 8
    """Connections one peer holds before they show a valid request."""
    admit_timeout_s: float = 2.0
    """Seconds from a connection's start to a valid request's headers."""
    request_timeout_s: float = 10.0
    """Seconds to send a whole request (headers and body) from its first byte."""

    def __post_init__(self) -> None:
        if not 0 <= self.reserved < self.max_connections:
            raise ConfigError(f"expected 0 <= reserved < max_connections ({self.max_connections}), got "
                              f"{self.reserved}; fix: keep room for waiting connections too (default 64 of 256)")
        if not 1 <= self.max_waiting_per_peer <= self.max_per_peer:
            raise ConfigError(f"expected 1 <= max_waiting_per_peer <= max_per_peer ({self.max_per_peer}), got "
                              f"{self.max_waiting_per_peer}; fix: the defaults are 8 and 128")
        if not (self.admit_timeout_s > 0 and self.request_timeout_s > 0):
            raise ConfigError(f"expected timeouts above 0 s, got admit {self.admit_timeout_s} and request "
                              f"{self.request_timeout_s}")


def peer_of(client: tuple[str, int] | None) -> str:
    """The peer a connection from ``client`` (address, port) counts against: an IPv4 address (an IPv4-mapped
    IPv6 address as its IPv4 one), an IPv6 address's /64, or ``"local"`` (a Unix socket)."""
    if client is None:
        return "local"
    try:
        address = ipaddress.ip_address(client[0].split("%")[0])
    except ValueError:
        return client[0]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


@dataclass(eq=False)
class _Entry:
    peer: str
    close: Callable[[str], None]  # closes the connection, the argument its reason (an evicted one's)
    sent: Callable[[], bool] = lambda: False  # whether a whole request head waits unread in its socket
    admitted: bool = False
    live: bool = True


@dataclass
class _Peer:
    total: int = 0
    waiting: dict[_Entry, None] = field(default_factory=dict)  # oldest first


class ConnectionTable:
    """The connections of one server by peer, waiting or admitted; runs on the server's event loop only."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.total = 0
        self.waiting: dict[_Entry, None] = {}  # oldest first
        self.peers: dict[str, _Peer] = {}

    def open(self, peer: str, close: Callable[[str], None], sent: Callable[[], bool] = lambda: False
             ) -> _Entry | str:
        """A new waiting connection of ``peer``, after closing what the bounds ask; a string: refused, why (every
        connection it could displace is admitted). ``sent()``: whether its request head waits unread."""
        limits, state = self.limits, self.peers.get(peer) or _Peer()
        if len(state.waiting) >= limits.max_waiting_per_peer:
            self._evict(_oldest(state.waiting), f"at most {limits.max_waiting_per_peer} connections from one "
                                                "address may wait to send a valid request")
        if state.total >= limits.max_per_peer:
            if not state.waiting:
                return f"at most {limits.max_per_peer} connections from one address, all in use"
            self._evict(_oldest(state.waiting), f"at most {limits.max_per_peer} connections from one address")
        if len(self.waiting) >= limits.max_connections - limits.reserved or self.total >= limits.max_connections:
            if not self.waiting:
                return f"at most {limits.max_connections} connections, all in use by clients that sent a valid request"
            self._evict(_oldest(self.waiting), f"at most {limits.max_connections - limits.reserved} "
                                               "connections may wait to send a valid request")
        entry = _Entry(peer, close, sent)
        self.peers[peer] = state
        state.total += 1
        state.waiting[entry] = None
        self.waiting[entry] = None
        self.total += 1
        return entry

    def admit(self, entry: _Entry) -> None:
        """``entry`` showed a valid request: it leaves the waiting ones."""
        if entry.live and not entry.admitted:
            entry.admitted = True
            self.waiting.pop(entry, None)
            state = self.peers.get(entry.peer)
            if state is not None:
                state.waiting.pop(entry, None)

    def drop(self, entry: _Entry) -> None:
        """``entry`` closed (again is harmless: an evicted connection reports its end later)."""
        if not entry.live:
            return
        entry.live = False
        self.waiting.pop(entry, None)
        state = self.peers[entry.peer]
        state.waiting.pop(entry, None)
        state.total -= 1
        self.total -= 1
        if state.total == 0:
            del self.peers[entry.peer]

    def _evict(self, entry: _Entry, why: str) -> None:
        close = entry.close
        self.drop(entry)
        close(why)


def _oldest(waiting: dict[_Entry, None]) -> _Entry:
    """The waiting connection to close: the oldest whose request head is not already in its socket unread (a
    client behind the flooding address whose request came in the same burst of accepts), else the oldest."""
    return next((entry for entry in waiting if not entry.sent()), next(iter(waiting)))


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"detail": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


def guarded_protocols(limits: ConnectionLimits, admits: Callable[[Headers], bool]
                      ) -> tuple[type[asyncio.Protocol], type[asyncio.Protocol] | None, ConnectionTable]:
    """uvicorn's h11 protocol and its WebSocket protocol bound by ``limits`` (module docstring), sharing one
    `ConnectionTable`; ``admits(headers)``: whether a request's headers are valid (`RequestGuard.admits`)."""
    table = ConnectionTable(limits)
    entries: dict[Any, _Entry] = {}  # transport -> its entry, while open (a WebSocket takes the transport over)

    class GuardedH11Protocol(H11Protocol):
        _entry: _Entry | None = None
        _admit_deadline: asyncio.TimerHandle | None = None
        _request_deadline: asyncio.TimerHandle | None = None
        _checked: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.transport = transport
            entry = table.open(peer_of(_remote(transport)), self._evicted, self._request_unread)
            if isinstance(entry, str):
                transport.write(_raw_response(503, "Service Unavailable", f"expected a free connection, got none "
                                              f"({entry}); fix: reuse a connection, or retry later"))
                transport.close()
                return
            self._entry = entry
            entries[transport] = entry
            super().connection_made(transport)
            self._admit_deadline = self.loop.call_later(limits.admit_timeout_s, self._not_admitted)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._entry is None:
                return
            self._disarm()
            self._cancel_admit()
            entries.pop(self.transport, None)
            table.drop(self._entry)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._entry is None:
                return
            if self._request_deadline is None and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self._arm()  # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
                self._disarm()  # the whole request is in (or the connection is done)

        def handle_events(self) -> None:
            super().handle_events()
            self._check_admission()

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._check_admission()
            if self._entry is not None and self._entry.admitted:
                self._disarm()  # a WebSocket's idle time is the session's (pings and the session timeout)
            super().handle_websocket_upgrade(event)

        def _request_unread(self) -> bool:
            """Whether a whole request head waits in the socket, not read yet (peeked: nothing is consumed)."""
            raw = self.transport.get_extra_info("socket")
            if raw is None or self.transport.is_closing():
                return False
            try:
                with socket.socket(fileno=os.dup(raw.fileno())) as sock:
                    return b"\r\n\r\n" in sock.recv(_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except OSError:
                return False

        def _check_admission(self) -> None:
            scope = self.scope
            if scope is None or scope is self._checked or self._entry is None or self._entry.admitted:
                return
            self._checked = scope
            if admits(list(scope["headers"])):  # ASGI types the headers as an iterable
                table.admit(self._entry)
                self._cancel_admit()

        def _arm(self) -> None:
            self._disarm()
            self._request_deadline = self.loop.call_later(limits.request_timeout_s, self._request_expired)

        def _disarm(self) -> None:
            if self._request_deadline is not None:
                self._request_deadline.cancel()
                self._request_deadline = None

        def _cancel_admit(self) -> None:
            if self._admit_deadline is not None:
                self._admit_deadline.cancel()
                self._admit_deadline = None

        def _request_expired(self) -> None:
            self._request_deadline = None
            self._close(408, "Request Timeout", f"expected a whole request within {limits.request_timeout_s:g} s, "
                                                "got part of one; fix: send the headers and body at once")

        def _not_admitted(self) -> None:
            self._admit_deadline = None
            self._close(408, "Request Timeout", f"expected a valid request (its Host, and a token when the server "
                                                f"has tokens) within {limits.admit_timeout_s:g} s of connecting, got "
                                                "none; fix: send the request as soon as the connection opens")

        def _evicted(self, why: str) -> None:
            self._cancel_admit()
            self._disarm()
            self._close(503, "Service Unavailable", f"expected a valid request sooner: this connection was closed "
                                                    f"because {why}; fix: send the request as soon as the "
                                                    "connection opens")

        def _close(self, status: int, reason: str, message: str) -> None:
            if self.transport.is_closing():
                return
            if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
                self.transport.write(_raw_response(status, reason, message))  # no answer begun: ours is its answer
            self.transport.close()

    ws_class: type[asyncio.Protocol] | None = None
    if isinstance(AutoWebSocketsProtocol, type):
        base: type[asyncio.Protocol] = AutoWebSocketsProtocol

        class GuardedWebSocketProtocol(base):  # type: ignore[valid-type, misc]
            """The WebSocket a guarded connection upgraded to: its end gives its room back."""

            def connection_lost(self, exc: Exception | None) -> None:
                entry = entries.pop(getattr(self, "transport", None), None)
                if entry is not None:
                    table.drop(entry)
                super().connection_lost(exc)

        ws_class = GuardedWebSocketProtocol
    return GuardedH11Protocol, ws_class, table


def _remote(transport: asyncio.Transport) -> tuple[str, int] | None:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, list | tuple) and len(peer) >= 2:
        return str(peer[0]), int(peer[1])
    return None
