"""What a request must be before the env server reads it, and how long a connection may take to send one.

`RequestGuard` (ASGI middleware, in front of every route and the WebSocket) refuses, each with its own status
and a one-line fix:

- a ``Host`` that is not the bound address (421): a web page that rebinds its own name to this machine sends
  its name. A loopback bind accepts ``127.0.0.1``, ``localhost`` and ``::1``; a wildcard bind any literal IP
  address; names the operator lists are accepted too. The port is not checked, so tunnels work; anything but
  ``name``, ``name:port``, ``[IPv6]`` or ``[IPv6]:port`` (``a:1@b``, ``[a]b``) is refused.
- any ``Origin`` header (403): the server answers programs, not web pages; browsers send ``Origin`` with every
  cross-origin request and every WebSocket handshake, programs do not.
- a missing or wrong token when the server has tokens (401): ``Authorization: Bearer TOKEN``, or Basic with
  the token as the password (what a client sends for ``http://user:TOKEN@host``).
- a body that is not JSON (415): a POST must be ``Content-Type: application/json``;
- a body without a ``Content-Length`` (411) or longer than ``max_body`` (413), before any of it is read;
- a body of more than ``MAX_JSON_ITEMS`` JSON strings, containers and items (413), counted on its bytes
  before it is parsed: parsing runs on the server's one event loop, and 16 MiB of ``[{},{},...]`` parse to
  about 800 MiB of Python objects in 2 s of that loop, while a turn's body is a handful of fields
  (`json_items`; the WebSocket's messages are counted the same way).

`RequestGuard.admits` is the same check of a request's headers (``Host``, ``Origin``, token) for the
connection's bounds (`serve_connections`): a connection is admitted by the first request that passes it. uvicorn
itself answers a malformed request (``Content-Length: -1``) 400 and closes it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

__all__ = ["ANONYMOUS", "MAX_JSON_ITEMS", "RequestGuard", "allowed_host_names", "is_loopback", "json_items",
           "too_many_items"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ANONYMOUS = "local"  # the owner of every request to a server without tokens
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_host_names(bound: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The ``Host`` names a server bound to ``bound`` answers (None: any literal IP address, a wildcard bind),
    with the operator's ``extra`` names."""
    extra = frozenset(name.lower() for name in extra)
    if is_loopback(bound):
        return _LOOPBACK_NAMES | {bound.lower()} | extra
    try:
        if ipaddress.ip_address(bound).is_unspecified:
            return None
    except ValueError:
        pass
    return frozenset({bound.lower()}) | extra


MAX_JSON_ITEMS = 10_000
"""Strings, containers and items (``{``, ``[`` and ``,`` outside strings) a request body or WebSocket message may
hold: a turn's body has a handful; ten thousand parse in about a millisecond."""

_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[^\s:\[\]@/\\?#]+))(?::[0-9]{0,5})?")
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)|[\[{,]', re.S)
"""A JSON string (to its closing quote or the end: every scan moves past it, so the count is linear in the
bytes), or a byte that opens a container or separates items."""


def _host_name(value: str) -> str | None:
    """The name part of a ``Host`` header: ``[::1]:80`` -> ``::1``, ``a.b:80`` -> ``a.b``, a bare IPv6 address
    as itself; None for anything else (userinfo, a second colon, text after a bracket)."""
    value = value.strip().lower()
    match = _HOST.fullmatch(value)
    if match is not None:
        return match["v6"] if match["v6"] is not None and _is_ip(match["v6"], 6) else match["name"]
    return value if ":" in value and _is_ip(value) else None


def json_items(data: bytes | str, most: int = MAX_JSON_ITEMS) -> int:
    """How many strings, containers and items ``data`` holds (its strings and the ``{``, ``[`` and ``,`` outside
    them), counted up to ``most + 1``: what parsing it would build, bounded before it is parsed."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    count = 0
    for _ in _JSON_TOKEN.finditer(raw):
        count += 1
        if count > most:
            break
    return count


def too_many_items(data: bytes | str, most: int = MAX_JSON_ITEMS) -> str | None:
    """The refusal of ``data`` when it holds more than ``most`` JSON strings, containers and items, else None."""
    if json_items(data, most) <= most:
        return None
    return (f"expected a JSON body of at most {most} strings, containers and items (a turn has a handful), got "
            "more; fix: send the action's text as one string")


def _is_ip(name: str, version: int | None = None) -> bool:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return version is None or address.version == version


def token_owner(token: str) -> str:
    """The owner name of requests that present ``token`` (a digest: owners are logged, tokens never)."""
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:16]


class RequestGuard:
    """ASGI middleware that refuses what the module docstring lists; a passed request carries its owner in
    ``scope["state"]["owner"]`` (a token's digest, or `ANONYMOUS` on a server without tokens)."""

    def __init__(self, app: Callable[..., Awaitable[None]], hosts: frozenset[str] | None, tokens: Iterable[str],
                 max_body: int):
        self.app, self.hosts, self.max_body = app, hosts, max_body
        self.tokens = [t.encode() for t in tokens]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _header_map(scope["headers"])
        refusal = self._check(scope, headers)
        if refusal is not None:
            await _refuse(scope, send, *refusal)
            return
        owner = self._owner(headers)
        if owner is None:
            await _refuse(scope, send, 401, "expected Authorization: Bearer TOKEN (or http://user:TOKEN@host in the "
                                           "URL), got none or a wrong one; fix: send the token the server's "
                                           "operator gave you", [(b"www-authenticate", b'Bearer, Basic realm="env"')])
            return
        scope.setdefault("state", {})["owner"] = owner
        if scope["type"] == "http" and headers.get("content-length", "0") != "0":
            read = await _read_body(receive)
            if read is None:  # nobody to answer
                return
            body, receive = read
            refusal_of_body = too_many_items(body)
            if refusal_of_body is not None:
                await _refuse(scope, send, 413, refusal_of_body)
                return
        await self.app(scope, receive, send)

    def admits(self, raw_headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """Whether a request with these headers passes the checks of its origin: the ``Host``, no ``Origin``, the
        token when the server has tokens (what admits a connection, `serve_connections`)."""
        headers = _header_map(raw_headers)
        return self._check_origin(headers) is None and self._owner(headers) is not None

    def _check(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        refusal = self._check_origin(headers)
        if refusal is not None or scope["type"] != "http":
            return refusal
        return self._check_body(scope, headers)

    def _check_origin(self, headers: dict[str, str]) -> tuple[int, str] | None:
        host = headers.get("host")
        if host is None:
            return 400, "expected a Host header, got none; fix: send HTTP/1.1 requests with Host"
        name = _host_name(host)
        allowed = name is not None and (name in self.hosts if self.hosts is not None else _is_ip(name))
        if not allowed:
            expect = ", ".join(sorted(self.hosts)) if self.hosts is not None else "a literal IP address"
            return 421, (f"expected Host {expect}, got {host!r}; fix: connect to the address the server is bound "
                         "to (its operator can allow more names with --allow-host)")
        if "origin" in headers:
            return 403, (f"expected no Origin header (this server answers programs, not web pages), got Origin "
                         f"{headers['origin'][:100]!r}; fix: call it from a program, not from a browser page")
        return None

    def _check_body(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        length = headers.get("content-length")
        if "transfer-encoding" in headers:
            return 411, "expected a Content-Length, got Transfer-Encoding; fix: send the body with its length"
        if length is not None and not length.isdigit():
            return 400, f"expected a Content-Length of digits, got {length[:40]!r}"
        if length is not None and int(length) > self.max_body:
            return 413, (f"expected a body of at most {self.max_body} bytes, got a Content-Length of {length}; "
                         "fix: a turn's action is far shorter")
        if scope["method"] not in ("GET", "HEAD"):
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return 415, (f"expected Content-Type application/json, got {media or 'none'!r}; fix: send the body "
                             "as JSON (an empty object for no arguments)")
        elif length not in (None, "0"):
            return 400, f"expected no body with {scope['method']}, got {length} bytes; fix: use POST"
        return None

    def _owner(self, headers: dict[str, str]) -> str | None:
        if not self.tokens:
            return ANONYMOUS
        kind, _, value = headers.get("authorization", "").partition(" ")
        presented = value.strip().encode()
        if kind.lower() == "basic":
            try:
                presented = base64.b64decode(presented, validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return None
        elif kind.lower() != "bearer":
            return None
        for token in self.tokens:
            if hmac.compare_digest(presented, token):
                return token_owner(token.decode())
        return None


def _header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers by lower-case name, repeated ones joined with commas."""
    headers: dict[str, str] = {}
    for key, value in raw:
        name = key.decode("latin-1").lower()
        headers[name] = f"{headers[name]}, {value.decode('latin-1')}" if name in headers else value.decode("latin-1")
    return headers


async def _read_body(receive: Receive) -> tuple[bytes, Receive] | None:
    """The request's whole body (its length is checked already) and a ``receive`` that hands it on again; None
    when the client left before sending it all."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    pending: list[MutableMapping[str, Any]] = [{"type": "http.request", "body": b"".join(chunks),
                                                "more_body": False}]

    async def replay() -> MutableMapping[str, Any]:
        return pending.pop() if pending else await receive()

    return pending[0]["body"], replay


async def _refuse(scope: Scope, send: Send, status: int, message: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), *(extra or [])]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})
