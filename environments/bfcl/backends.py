"""BFCL's executable multi-turn backends (classes from the `bfcl-eval` package), run without `eval`.

The env owns its instances (bfcl_eval's execute_multi_turn_func_call caches them in module globals and
evals the call strings: never used here). A call runs by attribute lookup of a declared tool name on the
instance that owns it, after jsonschema validation of its arguments.

A model's call runs in a bounded call (``sandbox.bounded``): on a copy of the instance sent as JSON data, in a
child process killed after ``CALL_BOUND.timeout_s`` seconds, with its memory capped; the instance's new state comes
back and replaces the old one (same object, so snapshots and owners stay valid). So ``power(base=10,
exponent=10000000)`` or ``square_root(number=2, precision=1000000)`` return a timeout error instead of
holding the trainer for seconds, and ``mpmath.mp``/``decimal`` precision changes die with the child. Ground-truth
calls (from the dataset, trusted) run in this process, with that process-wide state restored after each."""

from __future__ import annotations

import contextlib
import copy
import decimal
import functools
import importlib
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import jsonschema

from trace_gym.environments.bfcl.calls import Call
from trace_gym.environments.bfcl.data import FUNC_DOC_FILES
from trace_gym.environments.bfcl.schema import parameters_schema
from trace_gym.environments.sandbox.bounded import Bound, bounded_call
from trace_gym.errors import SetupError

# bfcl_eval.utils creates result folders under its project root at import; keep them out of the cwd.
os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "trace_gym_bfcl"))

_MODULE_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
# bfcl_eval/constants/executable_backend_config.py CLASS_FILE_PATH_MAPPING, the eight offline classes.
_CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
assert set(_CLASS_MODULES) == set(FUNC_DOC_FILES)
STATELESS_CLASSES = frozenset({"MathAPI"})  # executable_backend_config.STATELESS_CLASSES
CALL_BOUND = Bound(timeout_s=5.0, memory_bytes=1 << 30, max_result_bytes=16 << 20)
MAX_CALLS_PER_STEP = 8
"""Function calls run per step; the bundled ground truth makes at most 7 in a user turn, except in long context
(up to 34: the scripted expert spreads them over several steps)."""
STEP_TIME_S = 10.0
"""Seconds that the calls of one step share: each call gets what is left, at most ``CALL_BOUND.timeout_s``."""
MAX_RESULT_CHARS = 40_000
"""A call's result is cut here: the longest result of the bundled ground truth is 31,706 characters (a
long-context file listing), while a model can make results of megabytes (``mean`` of a long list, ``cat`` of a
file grown call by call)."""
MAX_STATE_DEPTH = 100
"""How deep a backend's state may nest (the bundled scenarios reach 15); a model can build deeper state one
``mkdir``/``cd`` at a time, and the recursive copies of snapshots overflow the stack at a few hundred levels."""


BFCL_INSTALL = "pip install --no-deps bfcl-eval==2026.3.23 mpmath"
"""bfcl-eval's backends and checkers, without its dependencies: those are every model provider's client (anthropic,
cohere, mistral, qwen-agent, sentence-transformers, faiss ...), which the checkers never call; no extra can say
``--no-deps``, so the ``bfcl`` extra brings mpmath and this line the rest."""


def require_bfcl_eval() -> None:
    """``SetupError`` with the install line when bfcl-eval is absent (one line from the command, not a traceback
    from deep inside the first step)."""
    try:
        importlib.import_module(_MODULE_PREFIX + _CLASS_MODULES["MathAPI"])
    except ImportError as e:
        raise SetupError(f"expected the bfcl-eval package for the BFCL envs, got ImportError: {e}; fix: "
                          f"{BFCL_INSTALL}") from None


def backend_class(name: str) -> type:
    """The bfcl-eval backend class called `name` (`SetupError` with the install line if bfcl-eval is absent)."""
    if name not in _CLASS_MODULES:
        raise ValueError(f"expected a BFCL backend class in {sorted(_CLASS_MODULES)}, got {name!r}")
    require_bfcl_eval()
    return getattr(importlib.import_module(_MODULE_PREFIX + _CLASS_MODULES[name]), name)


def make_instances(entry: Mapping[str, Any], long_context: bool) -> dict[str, Any]:
    """Fresh backend instances of an entry, loaded with its initial_config as BFCL does."""
    instances: dict[str, Any] = {}
    for name in entry["involved_classes"]:
        instance = backend_class(name)()
        if name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry.get("initial_config", {}).get(name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[name] = instance
    return instances


def method_owners(instances: Mapping[str, Any]) -> dict[str, str]:
    """Public method name -> owning class name; a later class wins a clash, as in BFCL's mapping."""
    owners: dict[str, str] = {}
    for class_name, instance in instances.items():
        for method_name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not method_name.startswith("_"):
                owners[method_name] = class_name
    return owners


def keyword_call(class_names: Sequence[str], call: Call) -> Call:
    """`call` with positional arguments bound to parameter names by the owning backend method's signature."""
    if not call.positional:
        return call
    for name in reversed(list(class_names)):  # a later class wins a name clash, as in method_owners
        method = getattr(backend_class(name), call.name, None)
        if callable(method) and not call.name.startswith("_"):
            bound = inspect.signature(method).bind_partial(None, *call.positional, **call.arguments)
            arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
            return Call(call.name, arguments)
    return call


def _jsonable(value: Any) -> Any:
    """The JSON view of a Python literal (tuples as lists) for schema validation only."""
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _without_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_types(v) for k, v in schema.items() if k != "type" or not isinstance(v, str)}
    return schema


class Validators:
    """jsonschema validators of the visible functions, built once per function doc.

    With `strict_types=False` (the default of the envs) the schemas keep names, required arguments, enums and
    nesting but drop value types: BFCL executes whatever Python values a call carries, and its own ground
    truth passes values of another type than the docs say (`close_ticket(ticket_id='ticket_001')` against
    an integer `ticket_id`), so checking types would fail calls that BFCL counts as right."""

    def __init__(self, strict_types: bool = False) -> None:
        self.strict_types = strict_types
        self._cache: dict[str, jsonschema.protocols.Validator] = {}

    def validate(self, doc: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
        validator = self._cache.get(doc["name"])
        if validator is None:
            schema = parameters_schema(dict(doc))
            if not self.strict_types:
                schema = {**_without_types(schema), "type": "object"}
            validator = jsonschema.Draft202012Validator(schema)
            self._cache[doc["name"]] = validator
        error = jsonschema.exceptions.best_match(validator.iter_errors(_jsonable(dict(arguments))))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where + ': ' if where else ''}{error.message}"


def format_result(result: Any) -> str:
    """A method's return value as BFCL's execute_multi_turn_func_call renders it."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


@contextlib.contextmanager
def process_state_kept():
    """Restore the process-wide state BFCL's backends change (mpmath precision, the decimal context)."""
    mp = None
    with contextlib.suppress(ImportError):
        import mpmath

        mp = mpmath.mp
    saved_mp = (mp.prec, mp.pretty) if mp is not None else None
    saved_decimal = decimal.getcontext().copy()
    try:
        yield
    finally:
        if mp is not None and saved_mp is not None:
            mp.prec, mp.pretty = saved_mp
        decimal.setcontext(saved_decimal)


def truncate_result(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a note of how much was cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... truncated {len(text) - max_chars} characters]"


def state_depth_problem(state: Any, max_depth: int = MAX_STATE_DEPTH) -> str | None:
    """Why a backend's state is too deep to keep, or None. Iterative, in the order of a recursive copy (depth
    first, attributes in order, each object once: a directory points back to its parent), so the depth found is
    the depth of the copy's recursion; an object of bfcl-eval counts as one level."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(state, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple | set | frozenset):
            children = item
        elif type(item).__module__.startswith("bfcl_eval.") and hasattr(item, "__dict__"):
            if id(item) in seen:
                continue
            seen.add(id(item))
            children = vars(item).values()
        else:
            continue
        if depth >= max_depth:
            return f"the backend's state would nest deeper than {max_depth} levels"
        stack.extend((child, depth + 1) for child in reversed(list(children)))
    return None


def run_method(instance: Any, name: str, arguments: Mapping[str, Any], stateless: bool,
               max_chars: int = MAX_RESULT_CHARS) -> tuple[str, bool, Any]:
    """One call on ``instance``: (result text cut to ``max_chars``, ok, the instance's state after it; None if
    stateless). Runs in the bounded call's child for model calls. A call that would make the state deeper than
    ``MAX_STATE_DEPTH`` is not applied (its state is not returned): deeper state breaks the recursive copies of
    snapshots."""
    try:
        text, ok = format_result(getattr(instance, name)(**arguments)), True
    except Exception as e:  # a backend raising on odd input is a model mistake, reported as BFCL does
        try:
            text, ok = f"Error during execution: {e}", False
        except ValueError:  # str() of an exception that holds an integer too long to print
            text, ok = f"Error during execution: {type(e).__name__}", False
    text = truncate_result(text, max_chars)
    if stateless:
        return text, ok, None
    problem = state_depth_problem(instance.__dict__)
    if problem is not None:
        return f"Error: the call was not applied: {problem}.", False, None
    return text, ok, instance.__dict__


@functools.cache
def state_classes(cls: type) -> tuple[type, ...]:
    """The classes defined in a backend's module (the backend and, e.g., the file system's nodes): the objects
    that may travel in its state to and from a bounded call."""
    module = sys.modules[cls.__module__]
    return tuple(c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__)


_WARMED: set[tuple[int, str]] = set()  # (pid, backend module) already imported by this process's call server


def warm_call_server(class_names: Sequence[str]) -> None:
    """Import the backends' modules in the call server now (once per process), so that the first model call of
    an episode does not spend its step's time on imports."""
    modules = {backend_class(name).__module__ for name in class_names} - {m for p, m in _WARMED if p == os.getpid()}
    if modules:
        bounded_call(truncate_result, "", 1, bound=CALL_BOUND, warm=tuple(sorted(modules)))
        _WARMED.update((os.getpid(), m) for m in modules)


def execute(instances: Mapping[str, Any], owners: Mapping[str, str], docs: Mapping[str, Mapping[str, Any]],
            validators: Validators, call: Call, bounded: bool = True, timeout_s: float | None = None,
            max_chars: int = MAX_RESULT_CHARS) -> tuple[str, bool]:
    """Run one decoded call on the owned instances: (result text, ok). Never raises on model input.

    `docs` are the functions visible to the model now; a call to anything else is refused. `bounded=False` runs
    it here (trusted ground-truth calls only). `timeout_s` (at most `CALL_BOUND.timeout_s`) bounds the call;
    its result is cut to `max_chars`."""
    doc = docs.get(call.name)
    if doc is None or call.name not in owners:
        return f"Error: no function named {call.name!r} is available.", False
    owner = owners[call.name]
    instance = instances[owner]
    method = getattr(instance, call.name)
    arguments = call.arguments
    if call.positional:
        try:
            arguments = dict(inspect.signature(method).bind_partial(*call.positional, **arguments).arguments)
        except TypeError as e:
            return f"Error: invalid arguments for {call.name}: {e}", False
    problem = validators.validate(doc, arguments)
    if problem is not None:
        return f"Error: invalid arguments for {call.name}: {problem}", False
    stateless = owner in STATELESS_CLASSES
    if not bounded:
        with process_state_kept():
            text, ok, _ = run_method(instance, call.name, arguments, True)
        return text, ok
    bound = CALL_BOUND if timeout_s is None else replace(CALL_BOUND, timeout_s=min(timeout_s, CALL_BOUND.timeout_s))
    # The ignore: mypy matches a class object against Hashable through the unbound object.__hash__.
    outcome = bounded_call(run_method, instance, call.name, dict(arguments), stateless, max_chars, bound=bound,
                           warm=(type(instance).__module__,), classes=state_classes(type(instance)))  # type: ignore[arg-type]
    if not outcome.ok:
        return f"Error during execution: the call was stopped ({outcome.error}).", False
    text, ok, state = outcome.value
    if state is not None:
        instance.__dict__.clear()
        instance.__dict__.update(state)
    return truncate_result(str(text), max_chars), bool(ok)
