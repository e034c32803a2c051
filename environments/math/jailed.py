"""The symbolic answer check, run in the jail that runs the math envs' cells (``sandbox.host``).

Once per process (and isolation level), a sandbox runs a setup cell that loads ``expressions.py`` and
``symbolic.py`` from their source, imports math-verify and warms its parsers; a native snapshot of it is kept.
Each check restores that snapshot into a new sandbox (a fork of the frozen worker), runs one cell that calls
``symbolic.symbolic_check`` on the data, and closes the sandbox: every check starts from the same state, under
the jail's namespaces, seccomp filter and unprivileged user, with the cell's limits (``LIMITS``), and nothing
it does outlives it. The cell's output is read as data: one JSON line, validated; anything else is an error
(reward 0).

Checks in one process run one at a time (they share the frozen snapshot). ``start_checker`` prepares the
snapshot ahead of the first check; its processes are registered as services (``trace_gym.processes``), as the
template's are.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from trace_gym.environments.sandbox.bounded import Outcome
from trace_gym.environments.sandbox.host import PythonSandbox, SandboxLimits, SandboxSnapshot
from trace_gym.processes import descendant_pids, register_service

TIMEOUT_S = 5.0
LIMITS = SandboxLimits(timeout_s=TIMEOUT_S, cpu_s=int(TIMEOUT_S) + 1, memory_bytes=3 << 30, max_output_chars=4000,
                       replay_s=0.0)
"""Per check. replay_s=0: a check never re-runs the setup cell (a lost snapshot is rebuilt under the lock)."""
_SETUP_LIMITS = SandboxLimits(timeout_s=120.0, cpu_s=120, memory_bytes=3 << 30, replay_s=0.0)
_MARK = "answer-check-verdict:"
_HERE = Path(__file__).resolve().parent
_METHODS = (None, "math_verify", "sympy")


def _setup_code() -> str:
    sources = {name: (_HERE / f"{name}.py").read_text() for name in ("expressions", "symbolic")}
    return f'''
import json, sys, types
for _name in ("trace_gym", "trace_gym.environments", "trace_gym.environments.math"):
    sys.modules.setdefault(_name, types.ModuleType(_name)).__path__ = []
def _load(_short, _source):
    _module = types.ModuleType("trace_gym.environments.math." + _short)
    sys.modules[_module.__name__] = _module
    setattr(sys.modules["trace_gym.environments.math"], _short, _module)
    exec(compile(_source, _short + ".py", "exec"), _module.__dict__)
    return _module
_load("expressions", {sources["expressions"]!r})
_symbolic = _load("symbolic", {sources["symbolic"]!r})
_symbolic.warm_up()
def _answer_check(_data):
    _symbolic.refuse_code_from_strings()
    print({_MARK!r} + json.dumps(_symbolic.symbolic_check(*json.loads(_data))))
'''


class _Checker:
    def __init__(self, isolation: str, user: str | None) -> None:
        self.isolation, self.user = isolation, user
        self.lock = threading.Lock()
        self.snapshot: SandboxSnapshot | None = None
        self.owner = os.getpid()

    def ready(self) -> SandboxSnapshot:
        """The warmed snapshot, made (again) if there is none in this process or its frozen fork is gone."""
        if self.snapshot is not None and self.snapshot.alive and self.owner == os.getpid():
            return self.snapshot
        before = descendant_pids()
        box = PythonSandbox(_SETUP_LIMITS, user=self.user, isolation=self.isolation)
        try:
            result = box.run(_setup_code())
            if not result.ok:
                raise RuntimeError(f"expected the jailed answer checker to start, it did not: {result.output[-800:]}")
            self.snapshot = box.snapshot(native=True)
        finally:
            box.close()
        if not self.snapshot.alive:
            raise RuntimeError("expected a native snapshot of the answer checker, got none (the jail refused it)")
        self.owner = os.getpid()
        register_service(*(descendant_pids() - before))  # the frozen checker and its lineage live with us
        return self.snapshot

    def run(self, data: str) -> tuple[str, str]:
        with self.lock:
            snapshot = self.ready()
            box = PythonSandbox(LIMITS, user=self.user, isolation=self.isolation)
            box.restore(snapshot)
            try:
                result = box.run(f"_answer_check({data!r})")
            finally:
                box.close()
        return result.output, result.status


_checkers: dict[tuple[str, str | None], _Checker] = {}
_checkers_lock = threading.Lock()


def _checker(isolation: str, user: str | None) -> _Checker:
    with _checkers_lock:
        return _checkers.setdefault((isolation, user), _Checker(isolation, user))


def start_checker(isolation: str = "jail", user: str | None = "nobody") -> None:
    """Prepare this process's checker now rather than at the first check (leak checks take their baseline
    after it)."""
    checker = _checker(isolation, user)
    with checker.lock:
        checker.ready()


def symbolic_check(golds: list[tuple[str, str]], pred: str, p: str, isolation: str = "jail",
                   user: str | None = "nobody") -> Outcome:
    """``symbolic.symbolic_check(golds, pred, p)`` in the jail: ``Outcome.value`` is (method or None, parsed
    gold, parsed answer); a timeout, a crash or output that is not one valid verdict is ``ok=False``."""
    output, status = _checker(isolation, user).run(json.dumps([golds, pred, p]))
    if status == "timeout":
        return Outcome(False, error=f"timed out after {TIMEOUT_S:g} s", timed_out=True)
    verdict = _verdict(output) if status == "ok" else None
    if verdict is None:
        return Outcome(False, error=f"the check's cell ended with status {status!r} and no verdict")
    return Outcome(True, verdict)


def _verdict(output: str) -> tuple[str | None, str, str] | None:
    lines = [line for line in output.splitlines() if line.startswith(_MARK)]
    if len(lines) != 1:
        return None
    try:
        value: Any = json.loads(lines[0][len(_MARK):])
    except ValueError:
        return None
    if (isinstance(value, list) and len(value) == 3 and value[0] in _METHODS
            and all(isinstance(v, str) for v in value[1:])):
        return value[0], value[1][:400], value[2][:400]
    return None
