"""Final-answer extraction and equivalence checking for math tasks.

An answer is untrusted text and is never run as code. Order of checks (the first that says "equal" wins):
normalised strings; exact rationals and decimals; the expression grammar of ``expressions.py`` (a parser that
cannot run code, with size limits), whose constant trees compare as exact rationals here; then, in the jail
(``jailed.py``), math-verify's LaTeX parser (sets, intervals, tuples, matrices) and sympy's ``simplify`` on trees
built by the grammar node by node (``symbolic.py``). Neither ``sympify``/``parse_expr`` on a string nor
math-verify's plain-expression parser (which calls ``parse_expr``) is used, and the checking process refuses
both (``symbolic.refuse_code_from_strings``).
Binary reward; the parsed forms are returned for ``info``. Nothing here raises on an answer.

Time and memory bound: the checks here are linear in the answer's length (inputs over ``MAX_CHARS`` get only
the string check), and the grammar sizes every constant power and factorial before computing it, so
``9^{9^{9^{9}}}`` or ``(10^{10})!`` get 0 with ``info["method"] == "too_large"`` at once. The jailed check has a
cell's limits (``jailed.LIMITS``): an answer that makes it work too long gets 0 with ``info["method"] ==
"timeout"`` and a note.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from trace_gym.environments.math import expressions, jailed

MAX_CHARS = expressions.MAX_CHARS
TIMEOUT_S = jailed.TIMEOUT_S

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
    if len(s) > MAX_CHARS:  # int() of thousands of digits is slow; such an answer gets only the string check
        return None
    m = (re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s, re.ASCII)
         or re.fullmatch(r"(-?)\\frac(\d)(\d)", s, re.ASCII))
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+(?:\.\d*)?(?:/\d+)?|-?\.\d+", s, re.ASCII):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _close(a: Fraction, b: Fraction) -> bool:
    """Equal, or within a relative 1e-6 when one is not an integer (a decimal written out to a few places), in
    exact arithmetic. Two integers must be equal: 1000001 is not 1000000."""
    if a.denominator == 1 and b.denominator == 1:
        return a == b
    return a == b or abs(a - b) <= Fraction(1, 10**6) * max(1, abs(b))


def _grammar(s: str) -> expressions.Node | None:
    try:
        return expressions.parse(s)
    except expressions.ExpressionError:
        return None


def check_answer(pred: str | None, gold: Any, isolation: str = "jail",
                 user: str | None = "nobody") -> tuple[float, dict[str, Any]]:
    """Reward 1.0 if ``pred`` is equivalent to ``gold`` (a string or a list of aliases), else 0.0, plus info.
    ``isolation`` and ``user``: the jail the symbolic check runs in (those of the env's sandbox)."""
    golds = [format_gold(g) for g in gold] if isinstance(gold, list | tuple) else [format_gold(gold)]
    info: dict[str, Any] = {"gold": golds[0], "parsed_answer": None, "method": None}
    if not isinstance(pred, str) or not pred.strip():
        info["method"] = "no_answer"
        return 0.0, info
    inner = extract_answer(pred) if ("\\boxed" in pred or "<answer>" in pred) else None
    pred = (inner if inner is not None else pred).strip()
    p = normalize(pred)
    info["parsed_answer"] = p
    pred_tree: expressions.Node | None = None
    if len(p) <= MAX_CHARS:
        try:
            pred_tree = expressions.parse(p)
        except expressions.TooLarge as e:
            info.update(method="too_large", note=f"the answer was not evaluated ({e}); it counts as wrong")
            return 0.0, info
        except expressions.ExpressionError:
            pass
    pred_value = expressions.exact_value(pred_tree) if pred_tree is not None else None
    symbolic: list[tuple[str, str]] = []
    for g_raw in golds:
        g = normalize(g_raw)
        if p == g:
            info["method"] = "exact"
            return 1.0, info
        pr, gr = _rational(p), _rational(g)
        if pr is not None and gr is not None:
            if _close(pr, gr):
                info["method"] = "numeric"
                return 1.0, info
            continue  # two plain numbers that differ: no symbolic check can make them equal
        gold_tree = _grammar(g) if pred_value is not None else None
        gold_value = expressions.exact_value(gold_tree) if gold_tree is not None else None
        if pred_value is not None and gold_value is not None:
            if _close(pred_value, gold_value):
                info["method"] = "numeric"
                return 1.0, info
            continue  # two exact rationals that differ
        if len(p) <= MAX_CHARS and len(g) <= MAX_CHARS:
            symbolic.append((g_raw, g))
    if symbolic:
        raw = pred if len(pred) <= MAX_CHARS else p  # math-verify reads the raw LaTeX when it is short
        outcome = jailed.symbolic_check(symbolic, raw, p, isolation=isolation, user=user)
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
