"""Shared work served in turn to the clients it is done for, so that one client's many costly requests cannot
make another's wait for all of them.

A ``Client`` is an owner (a credential: every session of one token is one owner) and a session of it. Code that
works for a client says so with ``on_behalf_of(client)`` (a context variable: the env server sets it around each
env call); a shared resource that queues work (the math envs' answer checkers) reads ``current_client()`` and
orders its waiters with a `FairQueue`: the owner with the fewest requests in service goes first, ties to the one
served longest ago (one never served first of all), then the same rule among that owner's sessions, then
arrival order. An owner that holds every server of a resource therefore gets the next free one only when no
other owner waits, and a newcomer waits for one request to finish, not for a queue of others' to drain.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections import Counter, deque
from collections.abc import Iterator
from typing import Generic, NamedTuple, TypeVar

__all__ = ["Client", "FairQueue", "current_client", "on_behalf_of"]

T = TypeVar("T")


class Client(NamedTuple):
    owner: str
    session: str = ""


NOBODY = Client("", "")
"""The client of work done outside any server (a trainer's own envs): one owner, served in arrival order."""
_CLIENT: contextvars.ContextVar[Client] = contextvars.ContextVar("trace_gym_client", default=NOBODY)


@contextlib.contextmanager
def on_behalf_of(client: Client) -> Iterator[None]:
    """Code in this block works for ``client``."""
    token = _CLIENT.set(client)
    try:
        yield
    finally:
        _CLIENT.reset(token)


def current_client() -> Client:
    return _CLIENT.get()


class FairQueue(Generic[T]):
    """Waiting items by client, taken in the module docstring's order. Not thread-safe: its owner locks.
    ``pop`` counts the item's client as in service until ``done``."""

    MEMORY = 10_000
    """Clients whose last service is remembered; one forgotten counts as served longest ago."""

    def __init__(self) -> None:
        self._waiting: dict[Client, deque[T]] = {}
        self._busy: Counter[Client | str] = Counter()
        self._served: dict[Client | str, int] = {}
        self._clock = itertools.count()

    def __len__(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def push(self, client: Client, item: T) -> None:
        self._waiting.setdefault(client, deque()).append(item)

    def remove(self, client: Client, item: T) -> bool:
        """Take ``item`` out of the queue (a waiter that gave up); False when it is not there (popped already)."""
        queue = self._waiting.get(client)
        if queue is None or item not in queue:
            return False
        queue.remove(item)
        if not queue:
            del self._waiting[client]
        return True

    def pop(self) -> tuple[Client, T]:
        """The next item and its client (IndexError when none waits)."""
        if not self._waiting:
            raise IndexError("pop from an empty FairQueue")
        owner = min(dict.fromkeys(c.owner for c in self._waiting), key=self._rank)
        client = min((c for c in self._waiting if c.owner == owner), key=self._rank)
        queue = self._waiting[client]
        item = queue.popleft()
        if not queue:
            del self._waiting[client]
        now = next(self._clock)
        for key in (client.owner, client):
            self._busy[key] += 1
            self._served.pop(key, None)
            self._served[key] = now  # last: the dict is ordered by last service, oldest first
        while len(self._served) > self.MEMORY:
            del self._served[next(iter(self._served))]
        return client, item

    def done(self, client: Client) -> None:
        """One of ``client``'s items left service."""
        for key in (client.owner, client):
            self._busy[key] -= 1
            if self._busy[key] <= 0:
                del self._busy[key]

    def _rank(self, key: Client | str) -> tuple[int, int]:
        return self._busy[key], self._served.get(key, -1)
