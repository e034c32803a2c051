"""The symbolic part of the math answer check: sympy on the grammar's trees, else math-verify's LaTeX parser.

Runs in the jail (``jailed.py`` sends this file and ``expressions.py`` in as source), in a process forked for one
check. Imports nothing of the host package but ``expressions``. ``refuse_code_from_strings`` closes the
process's paths from a string to code before any answer is read, and makes every comparison exact.

Where it departs from math-verify's ``verify``: numbers compare exactly. math-verify rounds floats to 6 decimal
places (``809.0000001`` equals 809; anything under 5e-7 equals 0) and accepts ``(a - b).evalf(15) == 0``
(a 30-digit rational equals ``\\sqrt{2}``); here decimals are read as exact rationals, those two shortcuts are
replaced by structural equality (``simplify(gold - answer)`` still decides), and only a gold written as a
decimal allows ``expressions.RELATIVE_TOLERANCE``, relative to the gold, in the grammar's path.
"""

from __future__ import annotations

import re
import signal
import time
from fractions import Fraction
from typing import Any

from trace_gym.environments.math import expressions

CPU_S = 3.0
"""CPU seconds one check may spend on an answer; past them the verdict says ``out_of_time`` (the answer's)."""


class OutOfTime(BaseException):
    """The check's CPU budget is spent (a BaseException: the libraries' ``except Exception`` must not eat it)."""


def _exact(expr: Any) -> Any:
    """``expr`` with every float replaced by the rational its decimal digits name."""
    import sympy

    try:
        floats = expr.atoms(sympy.Float)
    except (AttributeError, TypeError):
        return expr
    return expr.xreplace({f: sympy.Rational(str(f)) for f in floats}) if floats else expr


def math_verify_equal(gold: str, pred: str) -> tuple[bool, str, str]:
    from math_verify import LatexExtractionConfig, parse, verify

    # LaTeX extraction only: math-verify's ExprExtractionConfig hands the text to sympy's parse_expr (eval).
    # No timeouts of its own (SIGALRM, wall clock): the check's CPU budget (run_check) bounds it.
    configs = [LatexExtractionConfig()]
    g = [_exact(x) for x in parse(f"${gold}$", extraction_config=configs, parsing_timeout=None)]
    p = [_exact(x) for x in parse(f"${pred}$", extraction_config=configs, parsing_timeout=None)]
    if not g or not p:
        return False, str(g[0])[:400] if g else "", str(p[0])[:400] if p else ""
    # math-verify compares an interval or an ordered pair with the set of its elements as equal: the gold
    # (-\sqrt{3}, \sqrt{3}) would pay \pm\sqrt{3}, and (8/5, -35/2) would pay \{-35/2, 8/5\}. An ordered form
    # answers only an ordered form, a set only a set.
    ok = _family(g[0]) == _family(p[0]) and bool(verify(g, p, timeout_seconds=None))
    return ok, str(g[0])[:400], str(p[0])[:400]


def _family(expr: Any) -> str:
    """"ordered" (an interval, a union of them, a tuple), "set" (a finite set), else "other"; also as the right
    side of ``x = ...`` or ``x \\in ...``."""
    import sympy

    if isinstance(expr, sympy.Eq | sympy.Contains):
        expr = expr.args[1]
    if isinstance(expr, sympy.Interval | sympy.Union | sympy.Tuple | tuple):
        return "ordered"
    return "set" if isinstance(expr, sympy.FiniteSet) else "other"


def _apart(a: Any, b: Any) -> Any:
    """``|a - b|`` at 30 digits where it is clearly not 0 (at generic rational points for their symbols), else
    None. A difference that is 0 in exact arithmetic but not simplified evaluates to 0 or a few units of the last
    digit, never to more: a nonzero value here proves the two unequal, without ``simplify``."""
    import sympy

    symbols = sorted((a - b).free_symbols, key=str)
    points = {s: sympy.Rational(7 + 6 * i, 11 + 4 * i) for i, s in enumerate(symbols)}
    try:
        x, y = (a.subs(points), b.subs(points)) if points else (a, b)
        gap, scale = sympy.Abs(x - y).evalf(30), sympy.Abs(x).evalf(30) + sympy.Abs(y).evalf(30)
        finite = gap.is_real and scale.is_real and gap.is_finite and scale.is_finite
        if finite and gap > scale * sympy.Rational(1, 10**20):
            return gap
    except Exception:
        pass
    return None


def _equal(a: Any, b: Any, tolerance: Fraction | None) -> bool:
    import sympy

    if a == b:
        return True
    gap = _apart(a, b)
    if gap is not None:  # unequal; a decimal gold's tolerance is all that may still hold
        return bool(tolerance is not None and a.is_number and b.is_number
                    and gap <= sympy.Rational(tolerance) * sympy.Abs(a).evalf(30))
    difference = a - b
    if sympy.expand(difference) == 0 or sympy.simplify(difference) == 0:
        return True
    if tolerance is None or not (a.is_number and b.is_number):
        return False
    error, scale = sympy.Abs(difference).evalf(30), sympy.Abs(a).evalf(30)
    return bool(error.is_number and scale.is_number and error <= sympy.Rational(tolerance) * scale)


def sympy_equal(gold: str, pred: str) -> bool:
    """Both parsed by the grammar, built into sympy node by node, and equal exactly (``expand`` or ``simplify``
    of their difference is 0), or, for a gold written as a decimal, within its relative tolerance."""
    tolerance = expressions.relative_tolerance(gold)
    a, b = expressions.to_sympy(expressions.parse(gold)), expressions.to_sympy(expressions.parse(pred))
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(
            _equal(x, y, tolerance) for x, y in zip(a, b))
    return _equal(a, b, tolerance)


def refuse_code_from_strings() -> None:
    """Close, in the checking process, every way from a string to Python code: sympy's string parser accepts
    only number literals (what math-verify's LaTeX parser hands ``sympy.Number``; decimals become exact
    rationals) and never calls ``eval``; an audit hook refuses to compile any source that is not a file. A path
    to ``eval`` missed by the review of these libraries then fails the check (reward 0) instead of running the
    answer. math-verify's numeric comparison becomes structural equality (module docstring). Irreversible: call
    it only in a process that exists for one check."""
    import sys

    import sympy
    from math_verify import grader
    from sympy.parsing import sympy_parser

    def numbers_only(s: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(s, str) and re.fullmatch(r"[0-9]+", s.strip(), re.ASCII):
            return sympy.Integer(int(s))
        if isinstance(s, str) and re.fullmatch(r"[0-9]*\.[0-9]+|[0-9]+\.", s.strip(), re.ASCII):
            value = Fraction(s.strip())
            return sympy.Rational(value.numerator, value.denominator)
        raise ValueError("the answer checker does not parse strings as code")

    def no_eval(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("the answer checker does not evaluate strings")

    def structural(a: Any, b: Any, *args: Any) -> bool:
        try:
            return bool(a == b)
        except Exception:
            return False

    sympy_parser.parse_expr = numbers_only
    sympy_parser.eval_expr = no_eval
    grader.sympy_numeric_eq = structural

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "compile" and not (isinstance(args[1], str) and args[1].startswith("/")):
            raise RuntimeError("the answer checker compiles no code at run time")

    sys.addaudithook(hook)


def symbolic_check(golds: list[tuple[str, str]], pred: str, p: str) -> tuple[str | None, str, str]:
    """Against each (raw, normalised) gold: sympy on the grammar's trees when both parse, and that decides;
    else math-verify (its LaTeX parser). Returns (method or None, parsed gold, parsed pred); an exception in one
    comparison counts as "not equal"."""
    parsed_gold, parsed_pred = "", ""
    pred_in_grammar = _in_grammar(p)
    for g_raw, g in golds:
        if pred_in_grammar and _in_grammar(g):
            try:
                if sympy_equal(g, p):
                    return "sympy", g, p
            except Exception:
                pass
            continue
        try:
            ok, parsed_gold, parsed_pred = math_verify_equal(g_raw, pred)
        except Exception:
            ok = False
        if ok:
            return "math_verify", parsed_gold, parsed_pred
    return None, parsed_gold, parsed_pred


def _in_grammar(text: str) -> bool:
    try:
        expressions.parse(text)
    except expressions.ExpressionError:
        return False
    return True


def run_check(golds: list[tuple[str, str]], pred: str, p: str) -> dict[str, Any]:
    """``symbolic_check`` within ``CPU_S`` of this process's CPU time (ITIMER_PROF; a loaded machine slows the
    wall clock, not this budget): the verdict as plain data, ``out_of_time`` when the budget ran out."""

    def spent(signum: int, frame: Any) -> None:
        raise OutOfTime

    start, wall = time.process_time(), time.perf_counter()
    signal.signal(signal.SIGPROF, spent)
    signal.setitimer(signal.ITIMER_PROF, CPU_S)
    try:
        method, gold, answer = symbolic_check(golds, pred, p)
        out_of_time = False
    except OutOfTime:
        method, gold, answer, out_of_time = None, "", "", True
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return {"method": method, "gold": gold, "answer": answer, "out_of_time": out_of_time,
            "cpu_s": round(time.process_time() - start, 6), "wall_s": round(time.perf_counter() - wall, 6)}


WARM = ["\\frac{1}{2}", "x^2", "(3,\\frac{\\pi}{2})", "(3,\\pi/2)", "[2,5)", "\\sqrt{2}/2", "(-\\infty, 3]",
        "\\{1, 2, 3\\}", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
        "x \\le 3", "y = 2x + 3", "\\frac{\\sqrt{3}}{2}", "2\\sqrt{5}", "\\pi r^2", "\\infty", "-\\infty",
        "(-\\infty, -2) \\cup (3, \\infty)", "[0, 1]", "\\emptyset", "1.5", "50\\%", "\\dfrac{7}{3}", "e^{2}",
        "\\sin x", "\\cos(\\frac{\\pi}{3})", "\\log_2 8", "\\ln 2", "a+b", "2, 3, 5", "x = 4", "\\sqrt[3]{2}",
        "3 + 4i", "\\frac{a}{b}", "-\\frac{1}{2}", "10^{3}", "(1, 2, 3)", "\\mathbb{R}", "\\pm 2", "0.25"]
"""Forms the check meets (intervals, sets, matrices, relations, functions): parsed once in the frozen checker,
so that math-verify's parser has built its tables and sympy its caches before any check forks from it."""


def warm_up() -> None:
    """Load math-verify's and sympy's parsers and caches once (before the snapshot each check starts from)."""
    import gc
    import logging

    from math_verify import grader, parser

    parser.TIMEOUT_WARNING_SHOWN = grader.TIMEOUT_WARNING_SHOWN = True  # its timeouts are off on purpose
    logging.disable(logging.CRITICAL)  # a check prints its verdict line and nothing else
    for gold, pred in zip(WARM, WARM[1:] + WARM[:1]):
        for a, b in ((gold, pred), (gold, gold)):
            try:
                math_verify_equal(a, b)
                if _in_grammar(a) and _in_grammar(b):
                    sympy_equal(a, b)
            except Exception:
                pass
    gc.collect()
    gc.freeze()  # what the checker holds is never collected: a collection in a check would copy its pages
