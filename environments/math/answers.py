"""Final-answer extraction and equivalence checking for math tasks.

Order of checks (the first that says "equal" wins): normalised strings, exact rationals/decimals, math-verify
(LaTeX parser, sets, intervals, tuples, matrices), then sympy on plain expressions. Binary reward; the parsed
forms are returned for ``info``. Answers are untrusted text: nothing here raises on them.

Time and memory bound: the string and rational checks run here (linear in the answer's length); math-verify and
sympy run in a bounded call (``sandbox.bounded``): a child process killed ``TIMEOUT_S`` seconds after it starts,
with its memory capped. Answers such as ``\\boxed{9^{9^{9^{9}}}}`` or ``factorial(10**9)`` then get a verdict of 0
with ``info["method"] == "timeout"`` and a note, instead of hanging the step. Inputs over ``MAX_CHARS`` skip the
symbolic checks altogether.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from trace_gym.environments.sandbox.bounded import Bound, bounded_call

MAX_CHARS = 400
TIMEOUT_S = 5
MEMORY_BYTES = 2 << 30  # what the symbolic check may add to the call server's address space

_UNIT_WORDS = (r"(?:dollars?|cents?|units?|degrees?|cm|mm|km|m|meters?|inches|inch|feet|foot|ft|miles?|hours?|"
               r"minutes?|seconds?|days?|weeks?|years?|pounds?|ounces?|kg|g|grams?|liters?|mph|sq|square)")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start == -1:
        return None
    i = text.find("{", start)
    if i == -1:
        rest = text[start + len("\\boxed"):].strip()  # "\boxed 5"
        return rest.split("$")[0].strip() or None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last ``<answer>…</answer>`` (its ``\\boxed{}`` if it has one), else
    the last ``\\boxed{…}``; None if neither is present."""
    end = text.rfind("</answer>")
    if end != -1:
        start = text.rfind("<answer>", 0, end)
        if start != -1:
            body = text[start + len("<answer>") : end]
            return (last_boxed(body) or body).strip()
    boxed = last_boxed(text)
    return boxed.strip() if boxed is not None else None


def gsm8k_gold(solution: str) -> str:
    """GSM8K's answer field ends with ``#### <number>``."""
    return normalize(solution.rsplit("####", 1)[-1])


def format_gold(value: Any) -> str:
    """Gold answers as strings: AMC's floats (27.0) become integers where they are whole."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def normalize(s: str) -> str:
    """A canonical string: no $, spaces, \\left/\\right, \\text{units}, thousands separators or trailing dots."""
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{\s*" + _UNIT_WORDS + r"\s*\}", "", s)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"(?<=\d)\s*" + _UNIT_WORDS + r"\b\.?$", "", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""),
                     ("dfrac", "frac"), ("tfrac", "frac"), ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", ""),
                     ("%", ""), ("\\$", ""), ("\\displaystyle", "")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?:\D|$))", "", s)  # 1,000 -> 1000 (not the tuple "1,2")
    s = s.rstrip(".")
    if re.fullmatch(r"[a-zA-Z]=.+", s) and "," not in s:
        s = s[2:]  # "x=5" -> "5"
    return s


def _rational(s: str) -> Fraction | None:
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s) or re.fullmatch(r"(-?)\\frac(\d)(\d)", s)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+(?:\.\d*)?(?:/\d+)?|-?\.\d+", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _math_verify(gold: str, pred: str) -> tuple[bool, str, str]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    # The bounded call runs this in a child's main thread, where math-verify's own SIGALRM timeouts work.
    g = parse(f"${gold}$", extraction_config=configs, parsing_timeout=TIMEOUT_S)  # type: ignore[arg-type]
    p = parse(f"${pred}$", extraction_config=configs, parsing_timeout=TIMEOUT_S)  # type: ignore[arg-type]
    if not g or not p:
        return False, str(g[0]) if g else "", str(p[0]) if p else ""
    ok = bool(verify(g, p, timeout_seconds=TIMEOUT_S))  # type: ignore[arg-type]
    return ok, str(g[0]), str(p[0])


def _sympy_equal(gold: str, pred: str) -> bool:
    import sympy
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    def conv(s: str) -> Any:
        s = s.replace("^", "**").replace("\\pi", "pi").replace("\\sqrt", "sqrt").replace("{", "(").replace("}", ")")
        return parse_expr(s, transformations=(*standard_transformations, implicit_multiplication_application),
                          evaluate=True)

    a, b = conv(gold), conv(pred)
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(
            sympy.simplify(x - y) == 0 for x, y in zip(a, b))
    return bool(sympy.simplify(a - b) == 0)


def symbolic_check(golds: list[tuple[str, str]], pred: str, p: str) -> tuple[str | None, str, str]:
    """math-verify, then sympy, against each (raw, normalised) gold: (method or None, parsed gold, parsed pred).
    Runs inside a bounded call; an exception in one check counts as "not equal"."""
    parsed_gold, parsed_pred = "", ""
    for g_raw, g in golds:
        try:
            ok, parsed_gold, parsed_pred = _math_verify(g_raw, pred)
        except Exception:
            ok = False
        if ok:
            return "math_verify", parsed_gold, parsed_pred
        try:
            if _sympy_equal(g, p):
                return "sympy", parsed_gold, parsed_pred
        except Exception:
            pass
    return None, parsed_gold, parsed_pred


def warm_up() -> None:
    """Load math-verify's and sympy's parsers once (in the call server), so each check starts warm."""
    symbolic_check([("\\frac{1}{2}", "\\frac{1}{2}")], "x^2", "x^2")


def check_answer(pred: str | None, gold: Any) -> tuple[float, dict[str, Any]]:
    """Reward 1.0 if ``pred`` is equivalent to ``gold`` (a string or a list of aliases), else 0.0, plus info."""
    golds = [format_gold(g) for g in gold] if isinstance(gold, list | tuple) else [format_gold(gold)]
    info: dict[str, Any] = {"gold": golds[0], "parsed_answer": None, "method": None}
    if not isinstance(pred, str) or not pred.strip():
        info["method"] = "no_answer"
        return 0.0, info
    inner = extract_answer(pred) if ("\\boxed" in pred or "<answer>" in pred) else None
    pred = (inner if inner is not None else pred).strip()
    p = normalize(pred)
    info["parsed_answer"] = p
    symbolic: list[tuple[str, str]] = []
    for g_raw in golds:
        g = normalize(g_raw)
        if p == g:
            info["method"] = "exact"
            return 1.0, info
        pr, gr = _rational(p), _rational(g)
        if pr is not None and gr is not None:
            if pr == gr or abs(float(pr) - float(gr)) <= 1e-6 * max(1.0, abs(float(gr))):
                info["method"] = "numeric"
                return 1.0, info
            continue  # two plain numbers that differ: no symbolic check can make them equal
        if len(p) <= MAX_CHARS and len(g) <= MAX_CHARS:
            symbolic.append((g_raw, g))
    if symbolic:
        outcome = bounded_call(symbolic_check, symbolic, pred, p, bound=Bound(TIMEOUT_S, MEMORY_BYTES),
                               warm=(f"{__name__}:warm_up",))
        if not outcome.ok:
            info.update(method="timeout" if outcome.timed_out else "error",
                        note=f"the symbolic check stopped ({outcome.error}); the answer counts as wrong")
            return 0.0, info
        method, parsed_gold, parsed_pred = outcome.value
        info.update(parsed_gold=parsed_gold, parsed_answer=parsed_pred or p)
        if method is not None:
            info["method"] = method
            return 1.0, info
    info["method"] = "mismatch"
    return 0.0, info
