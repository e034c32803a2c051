"""The symbolic part of the math answer check: math-verify's LaTeX parser and sympy on the grammar's trees.

Runs in the jail (``jailed.py`` sends this file and ``expressions.py`` in as source), in a process forked for one
check. Imports nothing of the host package but ``expressions``. ``refuse_code_from_strings`` closes the
process's paths from a string to code before any answer is read.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from trace_gym.environments.math import expressions

TIMEOUT_S = 5


def math_verify_equal(gold: str, pred: str) -> tuple[bool, str, str]:
    from math_verify import LatexExtractionConfig, parse, verify

    # LaTeX extraction only: math-verify's ExprExtractionConfig hands the text to sympy's parse_expr (eval).
    configs = [LatexExtractionConfig()]
    # This runs in a cell's main thread, where math-verify's own SIGALRM timeouts work.
    g = parse(f"${gold}$", extraction_config=configs, parsing_timeout=TIMEOUT_S)  # type: ignore[arg-type]
    p = parse(f"${pred}$", extraction_config=configs, parsing_timeout=TIMEOUT_S)  # type: ignore[arg-type]
    if not g or not p:
        return False, str(g[0])[:400] if g else "", str(p[0])[:400] if p else ""
    ok = bool(verify(g, p, timeout_seconds=TIMEOUT_S))  # type: ignore[arg-type]
    return ok, str(g[0])[:400], str(p[0])[:400]


def sympy_equal(gold: str, pred: str) -> bool:
    """Both parsed by the grammar, built into sympy node by node, and ``simplify(gold - pred) == 0``."""
    import sympy

    a, b = expressions.to_sympy(expressions.parse(gold)), expressions.to_sympy(expressions.parse(pred))
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(
            sympy.simplify(x - y) == 0 for x, y in zip(a, b))
    return bool(sympy.simplify(a - b) == 0)


def refuse_code_from_strings() -> None:
    """Close, in the checking process, every way from a string to Python code: sympy's string parser accepts
    only number literals (what math-verify's LaTeX parser hands ``sympy.Number``) and never calls ``eval``; an
    audit hook refuses to compile any source that is not a file. A path to ``eval`` missed by the review of
    these libraries then fails the check (reward 0) instead of running the answer. Irreversible: call it only
    in a process that exists for one check."""
    import sys

    import sympy
    from sympy.parsing import sympy_parser

    def numbers_only(s: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(s, str) and re.fullmatch(r"[0-9]+", s.strip(), re.ASCII):
            return sympy.Integer(int(s))
        if isinstance(s, str) and re.fullmatch(r"[0-9]*\.[0-9]*(?:e-?[0-9]+)?", s.strip(), re.ASCII | re.I):
            return sympy.Float(s.strip())
        raise ValueError("the answer checker does not parse strings as code")

    def no_eval(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("the answer checker does not evaluate strings")

    sympy_parser.parse_expr = numbers_only
    sympy_parser.eval_expr = no_eval

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "compile" and not (isinstance(args[1], str) and args[1].startswith("/")):
            raise RuntimeError("the answer checker compiles no code at run time")

    sys.addaudithook(hook)


def symbolic_check(golds: list[tuple[str, str]], pred: str, p: str) -> tuple[str | None, str, str]:
    """math-verify (its LaTeX parser), then sympy on the grammar's trees, against each (raw, normalised) gold:
    (method or None, parsed gold, parsed pred). Runs in the jail, in a process that lives for this check only;
    an exception in one check counts as "not equal"."""
    refuse_code_from_strings()
    parsed_gold, parsed_pred = "", ""
    for g_raw, g in golds:
        try:
            ok, parsed_gold, parsed_pred = math_verify_equal(g_raw, pred)
        except Exception:
            ok = False
        if ok:
            return "math_verify", parsed_gold, parsed_pred
        try:
            if sympy_equal(g, p):
                return "sympy", parsed_gold, parsed_pred
        except Exception:
            pass
    return None, parsed_gold, parsed_pred


def warm_up() -> None:
    """Load math-verify's and sympy's parsers once (before the snapshot each check starts from)."""
    for gold, pred in (("\\frac{1}{2}", "x^2"), ("(3,\\frac{\\pi}{2})", "(3,\\pi/2)"), ("[2,5)", "\\sqrt{2}/2")):
        math_verify_equal(gold, pred)
        with contextlib.suppress(Exception):
            sympy_equal(gold, pred)
