"""Bounded calls: the value comes back, or the call is stopped (deadline, memory) and says so; nothing it does
to process-wide state reaches the caller; no process is left behind."""

from __future__ import annotations

import decimal
import json
import time

import pytest

from trace_gym.environments.sandbox.bounded import Bound, bounded_call
from trace_gym.processes import descendant_pids

GENEROUS_S = 30.0  # far above every deadline here plus start-up on a loaded 2-core machine; only a hang exceeds it


def add(a: int, b: int = 0) -> int:
    return a + b


def fail() -> None:
    raise ValueError("bad input")


def spin() -> None:
    while True:
        pass


def sleep_long() -> None:
    time.sleep(600)


def hoard() -> int:
    return len(bytearray(4 << 30))


def big_result() -> bytes:
    return b"x" * (8 << 20)


def change_process_state() -> tuple[int, int]:
    import mpmath

    decimal.getcontext().prec = 999
    mpmath.mp.dps = 999
    return decimal.getcontext().prec, mpmath.mp.dps


def huge_power() -> int:
    return len(str(10 ** 100_000_000))


def forge_reply(kind: str, marker: str) -> None:
    """A call that takes over its reply channel: it writes a frame of its choosing on every socket it holds and
    exits before the real reply (what an answer that ran code in the child could do)."""
    import os
    import pickle
    import socket
    import stat
    import struct

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (marker,))

    if kind == "pickle":
        body = pickle.dumps(("ok", Payload()))
    elif kind == "class":
        body = json.dumps({"kind": "ok", "value": {"o": 0, "c": "os:mkdir", "a": {"path": marker}}}).encode()
    elif kind == "huge":
        body = b"{" * (64 << 10)
    else:
        body = b'{"kind": "ok", "value": ' + b"9" * 5000 + b"}"
    for fd in range(3, 64):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                socket.socket(fileno=os.dup(fd)).sendall(struct.pack("!I", len(body)) + body)
        except OSError:
            pass
    os._exit(0)


@pytest.mark.parametrize("kind", ["pickle", "class", "huge", "bigint"])
def test_a_forged_reply_is_data_not_code(kind: str, tmp_path) -> None:
    marker = tmp_path / "ran"
    outcome = bounded_call(forge_reply, kind, str(marker))
    assert not outcome.ok and outcome.error
    assert kind != "class" or "may not travel" in outcome.error  # the forged frame was read, and refused
    assert not marker.exists()


def test_the_value_comes_back() -> None:
    assert bounded_call(add, 2, b=3).value == 5


def test_an_exception_is_an_error_not_a_raise() -> None:
    outcome = bounded_call(fail)
    assert not outcome.ok and "ValueError: bad input" in outcome.error


@pytest.mark.parametrize("fn", [spin, sleep_long, huge_power])
def test_a_call_past_its_deadline_is_stopped(fn) -> None:
    bounded_call(add, 1)  # the server is up: the bound below is about the call
    start = time.monotonic()
    outcome = bounded_call(fn, bound=Bound(timeout_s=1.0))
    assert outcome.timed_out and not outcome.ok and "timed out" in outcome.error
    assert time.monotonic() - start < GENEROUS_S


def test_memory_is_bounded() -> None:
    outcome = bounded_call(hoard, bound=Bound(timeout_s=20.0, memory_bytes=256 << 20))
    assert not outcome.ok and "memory" in outcome.error


def test_a_too_large_result_is_refused() -> None:
    outcome = bounded_call(big_result, bound=Bound(max_result_bytes=1 << 20))
    assert not outcome.ok and "too large" in outcome.error


def test_process_wide_state_stays_with_the_call() -> None:
    import mpmath

    before = decimal.getcontext().prec, mpmath.mp.dps
    # mpmath is imported once in the server (warm), outside the deadline: on a loaded machine its import alone
    # can take the whole 5 s
    assert bounded_call(change_process_state, warm=("mpmath",)).value == (999, 999)
    assert (decimal.getcontext().prec, mpmath.mp.dps) == before


def test_a_function_that_cannot_travel_gets_a_clear_error() -> None:
    outcome = bounded_call(lambda: 1)
    assert not outcome.ok and "module-level function" in outcome.error


def test_no_call_process_is_left_behind() -> None:
    bounded_call(add, 1)
    before = descendant_pids()
    for fn in (spin, sleep_long, add):
        bounded_call(fn, 1, bound=Bound(timeout_s=0.5)) if fn is add else bounded_call(fn, bound=Bound(timeout_s=0.5))
    for _ in range(200):
        if descendant_pids() <= before:
            break
        time.sleep(0.02)
    assert descendant_pids() <= before
