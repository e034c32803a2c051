"""The jailed symbolic check: its verdict is one validated JSON line, each check starts from the same state, and
the checker's own failures never cost an answer its reward (tested by killing and stopping its processes from
outside, as an attacker or a crash would), while an answer that hangs or crashes its check gets 0 after a
bounded number of runs."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trace_gym.environments.math import jailed
from trace_gym.environments.math.answers import check_answer
from trace_gym.errors import InfraError
from trace_gym.fairness import Client, on_behalf_of
from trace_gym.processes import descendant_pids, parent_pid, services

MARK = jailed._MARK
GOOD = ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}")  # a correct answer that needs the symbolic check
# A correct answer whose check takes long enough (about 0.7 s of CPU) to be seen running: sympy expands both.
SLOW = ("(x^2y+x^2z+y^2x+y^2z+z^2x+z^2y+2x(yz))^{10}", "((x+y)(y+z)(z+x))^{10}")


def _line(**fields) -> str:
    verdict = {"method": "sympy", "gold": "x", "answer": "x", "out_of_time": False, "cpu_s": 0.01,
               "wall_s": 0.01} | fields
    return MARK + json.dumps(verdict) + "\n"


@pytest.mark.parametrize(("output", "method"), [
    (_line(), "sympy"),
    (_line(method=None, gold="", answer=""), None),
    ("noise\n" + _line(method="math_verify"), "math_verify"),
])
def test_a_verdict_line_is_read(output: str, method) -> None:
    verdict = jailed._verdict(output)
    assert verdict is not None and verdict["method"] == method


@pytest.mark.parametrize("output", [
    "",
    _line() + _line(),                                   # two verdicts: neither counts
    _line(method="exact"),                               # not a method the jail may report
    _line(gold=1),
    _line(out_of_time="no"),
    MARK + json.dumps({"method": "sympy"}) + "\n",       # fields missing
    MARK + json.dumps({"method": "sympy", "gold": "x", "answer": "x", "out_of_time": False, "cpu_s": 0,
                       "wall_s": 0, "extra": 1}) + "\n",
    MARK + "not json\n",
    'print("' + _line().strip().replace('"', '\\"') + '")',  # the mark not at a line start
])
def test_anything_but_one_valid_verdict_is_no_verdict(output: str) -> None:
    assert jailed._verdict(output) is None


def test_a_timed_out_check_does_not_spoil_later_checks() -> None:
    # The same pair gives the same verdict after a timeout and after other answers: each check is a fresh
    # restore of the warmed snapshot, not a cell after the previous ones.
    first = check_answer(*GOOD)
    assert check_answer("\\{9^{9^{9^{9}}}\\}", "\\{3\\}")[1]["method"] == "timeout"
    check_answer("(x+1)(x-1)", "x^2-1")
    assert check_answer(*GOOD) == first and first[0] == 1.0


# --------------------------------------------------------------------------- the checker's lifetime
def _frozen_forks() -> list[int]:
    """The checkers' frozen forks as the process accounting shows them: registered services, descendants of
    this process, each the child of its lineage's supervisor."""
    jailed.start_checker()
    pids = jailed.checker_pids()
    assert pids and set(pids) <= services() and set(pids) <= descendant_pids()
    return pids


def _cells(frozen: list[int]) -> list[int]:
    """Cell processes of checks running on these checkers (each a grandchild: frozen -> worker -> cell)."""
    return [cell for f in frozen for worker in jailed._children(f) for cell in jailed._children(worker)]


@pytest.mark.parametrize("how", ["kill the frozen fork", "kill its supervisor", "stop the frozen fork"])
def test_a_lost_checker_is_rebuilt_and_the_next_correct_answer_still_scores(how: str) -> None:
    victims = _frozen_forks()
    for frozen in victims:
        if how == "kill its supervisor":
            os.kill(parent_pid(frozen), signal.SIGKILL)
        else:
            os.kill(frozen, signal.SIGSTOP if how == "stop the frozen fork" else signal.SIGKILL)
    try:
        start = time.monotonic()
        reward, info = check_answer(*GOOD)
        assert reward == 1.0, info
        assert time.monotonic() - start < 60  # rebuilt at once: no wait for a stopped fork's spawn deadline
        assert [check_answer(*GOOD)[0] for _ in range(2 * len(victims))] == [1.0] * (2 * len(victims))
        assert not set(jailed.checker_pids()) & set(victims)  # each checker has had a turn: all were rebuilt
    finally:
        for frozen in victims:
            if how == "stop the frozen fork":
                with pytest.raises(ProcessLookupError):
                    os.kill(frozen, signal.SIGCONT)  # rebuilding released it; its lineage is gone


def test_checks_from_short_lived_threads_score() -> None:
    results: list[float] = []
    for pair in [GOOD, ("(x+1)(x-1)", "x^2-1"), GOOD, ("[2,5)", "[2, 5)")]:
        thread = threading.Thread(target=lambda p=pair: results.append(check_answer(*p)[0]))
        thread.start()
        thread.join()
    assert results == [1.0] * 4


def test_a_checker_built_from_a_thread_that_ended_serves_later_checks(tmp_path: Path) -> None:
    # A fresh process: its jail and its checkers are started from a thread that has ended by the time it checks
    # (the pool's own threads start what must outlive the caller; a jail tied to the caller is rebuilt).
    script = tmp_path / "ended.py"
    script.write_text(
        "import threading\n"
        "from trace_gym.environments.math.answers import check_answer\n"
        "from trace_gym.environments.math.jailed import start_checker\n"
        "from trace_gym.environments.sandbox.host import PythonSandbox\n"
        "def start():\n"
        "    PythonSandbox().run('1')\n"
        "    start_checker()\n"
        "t = threading.Thread(target=start); t.start(); t.join()\n"
        f"print([check_answer({GOOD[0]!r}, {GOOD[1]!r})[0] for _ in range(3)])\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.stdout.strip().splitlines()[-1:] == ["[1.0, 1.0, 1.0]"], done.stderr[-2000:]


def test_a_check_whose_cell_is_killed_is_run_again_and_scores() -> None:
    # Killed from outside while it runs: not the answer's doing, so it is run once more.
    frozen = _frozen_forks()
    killed: list[int] = []

    def kill_the_first_cell() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for cell in _cells(frozen)[:1]:
                os.kill(cell, signal.SIGKILL)
                killed.append(cell)
            time.sleep(0.002)

    killer = threading.Thread(target=kill_the_first_cell)
    killer.start()
    reward, info = check_answer(*SLOW)
    killer.join()
    assert killed and reward == 1.0, info


def test_an_answer_whose_check_always_crashes_gets_zero_after_a_bounded_number_of_runs() -> None:
    # A stand-in for an answer that crashes its own check: every cell that runs it is killed. The checker stays
    # healthy, so the answer is blamed after ANSWER_ATTEMPTS runs, not retried for ever.
    frozen = _frozen_forks()
    stop, killed = threading.Event(), []

    def kill_every_cell() -> None:
        while not stop.is_set():
            for cell in _cells(frozen):
                try:
                    os.kill(cell, signal.SIGKILL)
                    killed.append(cell)
                except ProcessLookupError:
                    pass
            time.sleep(0.001)

    killer = threading.Thread(target=kill_every_cell)
    killer.start()
    try:
        reward, info = check_answer(*SLOW)
    finally:
        stop.set()
        killer.join()
    assert (reward, info["method"]) == (0.0, "error"), info
    # Each run may lose two processes: the one its worker forked ahead (killed while it waited) and the one the
    # worker then forks at the cell.
    assert f"{jailed.ANSWER_ATTEMPTS} times" in info["note"]
    assert jailed.ANSWER_ATTEMPTS <= len(set(killed)) <= 2 * jailed.ANSWER_ATTEMPTS
    assert check_answer(*GOOD)[0] == 1.0


def test_an_answer_that_spends_the_cpu_budget_gets_zero_without_a_second_run() -> None:
    # A set (outside the grammar) whose comparison evaluates the tower: its CPU time runs out, the answer's fault.
    start = time.monotonic()
    reward, info = check_answer("\\{9^{9^{9^{9}}}\\}", "\\{3\\}")
    assert (reward, info["method"]) == (0.0, "timeout") and "CPU" in info["note"], info
    assert time.monotonic() - start < jailed.TIMEOUT_S + 30


# --------------------------------------------------------------------------- the pool
def test_the_pool_is_sized_to_the_machine_and_checks_in_parallel() -> None:
    jailed.start_checker()
    assert 1 <= len(jailed.checker_pids()) <= len(os.sched_getaffinity(0))
    results: list[float] = []
    threads = [threading.Thread(target=lambda p=pair: results.append(check_answer(*p)[0]))
               for pair in [GOOD, ("(x+1)(x-1)", "x^2-1"), ("[2, \\frac{10}{2})", "[2,5)")] * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1.0] * len(threads)


def test_a_check_that_finds_every_checker_busy_past_the_bound_raises(monkeypatch) -> None:
    # Infrastructure, not the answer: it must not come back as a 0.
    jailed.start_checker()
    pool = jailed._pool("jail", "nobody")
    hog = Client("hog")
    held = [pool.acquire(hog) for _ in range(len(pool.checkers))]
    monkeypatch.setattr(jailed, "QUEUE_WAIT_S", 0.2)
    try:
        with pytest.raises(jailed.CheckerUnavailableError, match="busy") as caught:
            check_answer(*GOOD)
        assert isinstance(caught.value, InfraError)
    finally:
        for checker in held:
            pool.release(checker, hog)
    assert check_answer(*GOOD)[0] == 1.0


def test_a_client_whose_checks_hold_every_checker_lets_another_clients_check_go_next() -> None:
    """One client holds every checker and has more checks queued; another client's check, queued after them,
    gets the next free checker: it scores before any of the first client's queued checks is done."""
    jailed.start_checker()
    pool = jailed._pool("jail", "nobody")
    hog, other = Client("hog", "s1"), Client("other", "s2")
    held = [pool.acquire(hog) for _ in range(len(pool.checkers))]
    finished: list[str] = []

    def check(client: Client, name: str) -> None:
        with on_behalf_of(client):
            assert check_answer(*GOOD)[0] == 1.0
        finished.append(name)

    threads = [threading.Thread(target=check, args=(Client("hog", f"s{i + 3}"), f"hog{i}")) for i in range(3)]
    for thread in threads:
        thread.start()
    _until(lambda: len(pool.waiting) == 3)
    threads.append(threading.Thread(target=check, args=(other, "other")))
    threads[-1].start()
    _until(lambda: len(pool.waiting) == 4)
    pool.release(held.pop(), hog)  # one checker goes round; the others stay held
    for thread in threads:
        thread.join(timeout=300)
    for checker in held:
        pool.release(checker, hog)
    assert finished[0] == "other" and sorted(finished[1:]) == ["hog0", "hog1", "hog2"]


def _until(condition) -> None:
    deadline = time.monotonic() + 60
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def test_a_check_without_a_checker_in_time_ends_the_episode_unscored(monkeypatch, tmp_path: Path) -> None:
    """The env's step reports the infrastructure's failure (reward 0.0, truncated, stop reason "infra_error", the
    reason in one line), never the answer's 0 and never an exception."""
    from trace_gym.environments.math.env import MathEnv

    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"problem": "Write 1/sqrt(2) another way.", "answer": GOOD[1]}) + "\n")
    env = MathEnv(dataset="math500", data_path=str(data))
    env.reset(options={"index": 0})
    jailed.start_checker()
    pool = jailed._pool("jail", "nobody")
    hog = Client("hog")
    held = [pool.acquire(hog) for _ in range(len(pool.checkers))]
    monkeypatch.setattr(jailed, "QUEUE_WAIT_S", 0.2)
    try:
        _, reward, terminated, truncated, info = env.step(f"\\boxed{{{GOOD[0]}}}")
    finally:
        for checker in held:
            pool.release(checker, hog)
        env.close()
    assert (reward, terminated, truncated, info["stop_reason"]) == (0.0, False, True, "infra_error")
    assert "free answer checker" in info["error"] and "\n" not in info["error"] and env.done
