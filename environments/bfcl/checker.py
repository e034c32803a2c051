"""BFCL's verdicts, from its own checker functions.

Multi-turn: per user turn with a non-empty ground truth, the model must have made a call in that turn, then
bfcl_eval's `state_checker` (public attributes of every backend instance equal the ground truth's) and
`response_checker` (every ground-truth result of the turn appears among the model's results so far) must pass;
this is bfcl_eval multi_turn_checker's per-turn body, with the instances held by the env instead of its
module-global cache. Single-turn: bfcl_eval's `ast_checker` itself.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from trace_gym.environments.bfcl import backends  # noqa: F401 - sets BFCL_PROJECT_ROOT before bfcl_eval loads
from trace_gym.environments.bfcl.calls import Call

_CHECKER_MODEL = "trace-gym"


@cache
def _multi_turn_checker() -> types.ModuleType:
    return importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")


class _NoDotRewrite(dict):
    """Stand-in for bfcl_eval.constants.model_config.MODEL_CONFIG_MAPPING: every model keeps dotted names."""

    def __missing__(self, key: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(underscore_to_dot=False)


@cache
def _ast_checker() -> types.ModuleType:
    """bfcl_eval's ast_checker module.

    It imports MODEL_CONFIG_MAPPING only to decide whether a model's function names had dots replaced by
    underscores; that module imports every provider client (anthropic, openai, ...), which the --no-deps
    install lacks. While the checker imports, a stand-in mapping answers "no rewrite" (our names keep their
    dots); the stand-in is removed from sys.modules afterwards."""
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    stand_in = types.ModuleType(name)
    stand_in.MODEL_CONFIG_MAPPING = _NoDotRewrite()  # type: ignore[attr-defined]
    sys.modules[name] = stand_in
    try:
        return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    finally:
        del sys.modules[name]


def check_turn(turn_index: int, made_call: bool, model_instances: Mapping[str, Any],
               ground_truth_instances: Mapping[str, Any], model_results: Sequence[str],
               ground_truth_results: Sequence[str], ground_truth_calls: Sequence[str]) -> dict[str, Any]:
    """BFCL's verdict on one finished user turn: {"valid": bool, "error_type"?, "error_message"?}.

    `model_results` are the results of every decoded model call so far (all turns), in order."""
    if not ground_truth_calls:  # the model should not (be able to) satisfy this turn; BFCL checks nothing here
        return {"valid": True}
    if not made_call:
        return {"valid": False, "error_type": "multi_turn:empty_turn_model_response",
                "error_message": f"Model response list is empty for turn {turn_index}"}
    checker = _multi_turn_checker()
    state = checker.state_checker(dict(model_instances), dict(ground_truth_instances))
    if not state["valid"]:
        return {"valid": False, "error_type": state["error_type"], "error_message": state["error_message"],
                "differences": sorted(state["details"]["differences"])}
    response = checker.response_checker(list(model_results), list(ground_truth_results), turn_index)
    if not response["valid"]:
        return {"valid": False, "error_type": response["error_type"], "error_message": response["error_message"]}
    return {"valid": True}


def _bind_positional(call: Call, docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not call.positional:
        return dict(call.arguments)
    doc = next((d for d in docs if d["name"] == call.name), None)
    names = list((doc or {}).get("parameters", {}).get("properties", {}))
    bound = dict(zip(names, call.positional))
    bound.update(call.arguments)
    return bound


def ast_verdict(category: str, functions: Sequence[Mapping[str, Any]], calls: Sequence[Call],
                ground_truth: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """bfcl_eval's AST verdict for a single-turn answer: {"valid": bool, "error"?, "error_type"?}.

    Positional arguments are bound in the order of the doc's `properties` (BFCL's decoder drops them)."""
    if not calls:
        return {"valid": False, "error": ["no function call decoded"], "error_type": "ast_decoder:decoder_failed"}
    model_output = [{c.name: _bind_positional(c, functions)} for c in calls]
    language = importlib.import_module("bfcl_eval.constants.enums").Language.PYTHON
    try:
        result = _ast_checker().ast_checker([dict(f) for f in functions], model_output, list(ground_truth),
                                            language, category, _CHECKER_MODEL)
    except Exception as e:  # the checker trips on some odd values (e.g. unhashable enum candidates)
        return {"valid": False, "error": [f"checker error: {e}"], "error_type": "ast_checker:exception"}
    return {k: v for k, v in result.items() if k in ("valid", "error", "error_type")}


def irrelevance_verdict(made_call_attempt: bool) -> dict[str, Any]:
    """BFCL's irrelevance rule: right iff the answer holds no function call."""
    if made_call_attempt:
        return {"valid": False, "error": ["Valid syntax. Successfully decode AST when it should not."],
                "error_type": "irrelevance_error:decoder_success"}
    return {"valid": True}
